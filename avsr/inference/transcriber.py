"""Transcriber: a model, its tokenizer and a search -- text from audio and/or video, batched over utterances.

ESPnet's ``Speech2Text`` (``espnet2/bin/asr_inference.py``) made smaller. Built from its parts and settings
(:meth:`Transcriber.from_pretrained` for a trained model), it has a call's items read, cut and bucketed by
length (:mod:`avsr.inference.batching`), computes the recipe's features and decodes with
:class:`avsr.decode.searcher.Searcher` (for audio-visual input of a model with an audio gate: the fused
input's and the video-only view's searches, ranked with the single-stream views' scores); word timings come
from a CTC forced alignment (:mod:`avsr.decode.align`).
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from avsr.compat import FairseqTokenizer
from avsr.data.datadir import Utterance
from avsr.data.noise import NoiseSource
from avsr.data.tokenizer import Tokenizer
from avsr.decode.config import SearchConfig, resolve_search_config
from avsr.decode.searcher import Searcher
from avsr.inference.batching import Call, cached_video_features, model_inputs
from avsr.inference.batching import report as _report
from avsr.inference.inputs import as_item, noise_source
from avsr.inference.pretrained import load_pretrained
from avsr.inference.segments import MIN_SEGMENT_S, EdgeRanges, check_edges
from avsr.inference.transcripts import TranscriptWriter
from avsr.inference.types import InferenceError, Media, PathLike, TranscribeItem, Transcript
from avsr.inference.video_cache import VersionKey, stem_radius
from avsr.modalities import MODALITY_INPUTS
from avsr.models.asr import AVSRModel
from avsr.nn.precision import autocast_context, check_precision, resolve_precision
from avsr.pretrained import resolve_model, shipped_decode_config
from avsr.threads import apply_threads

__all__ = ["Transcriber"]

logger = logging.getLogger("avsr.inference")

DecodeConfigLike = SearchConfig | Mapping[str, Any] | PathLike | None


class Transcriber:
    """A model, its tokenizer, a search configuration and the preprocessing: text from audio and/or video.

    All settings are given here; the object does not change afterwards.

    Args:
        model: the ASR model (put in eval mode and moved to ``device``).
        tokenizer: :class:`avsr.data.tokenizer.Tokenizer` (avsr models) or
            :class:`avsr.compat.FairseqTokenizer` (official models; their lower-case text is upper-cased).
        decode_config: a :class:`avsr.decode.DecodeConfig`, the name of a shipped one (``"default"``,
            ``"avhubert_s2s"``) or a YAML path, a mapping of options over ``decode_defaults``, or None:
            ``decode_defaults`` (:func:`avsr.decode.config.resolve_search_config`).
        device: where the model runs (``"cpu"``, ``"cuda"``).
        precision: ``fp32`` (the same WER on every machine), ``bf16`` (the encoder under bf16 autocast) or
            ``auto`` (:func:`avsr.nn.precision.resolve_precision`; resolved in :attr:`precision`).
        batch_frames: padded 25 fps frames per batch in :meth:`transcribe_batch`.
        max_segment_s: an utterance longer than this (seconds) is cut at pauses into pieces of at most this
            length (:func:`avsr.inference.segments.pause_cuts`), decoded and joined; None: never cut.
        train_max_s: the longest training utterance in seconds; a longer input that is not cut gets a
            warning (``info["warning"]``).
        edge_frames: ``(start, end)``, each a count of silent 40 ms frames or a range ``(lo, hi)``: bring
            every input's silence before and after its speech into it, normally the middle half of the model's
            training edges (:mod:`avsr.inference.segments`); the change is ``info["edges_changed_frames"]``;
            ``num_frames`` and word timings stay the input's. None: as given.
        narrowband_trained: whether the model heard 8 kHz audio; if not, audio below 16 kHz gets a warning.
        decode_overrides: options over ``decode_config`` (e.g. ``{"beam_size": 10}``).
        num_threads: the process's CPU intra-op threads: None leaves them, ``"auto"`` chooses them for the
            machine as it is (:func:`avsr.threads.apply_threads`), a count sets them. Ignored on a GPU.
        decode_defaults: the model's decoding defaults, its checkpoint's decode section
            (:func:`avsr.inference.pretrained.checkpoint_decode_defaults`); None: none.

    Raises:
        avsr.config.ConfigError: a bad decoding configuration or override (unknown key named).
        ValueError: an unknown precision, bad ``edge_frames`` or ``max_segment_s``, a search that needs a
            part the model lacks, a ``num_threads`` below 1 or another string than ``"auto"``.
    """

    def __init__(self, model: AVSRModel, tokenizer: Tokenizer | FairseqTokenizer,
                 decode_config: DecodeConfigLike = None, *, device: str | torch.device = "cpu",
                 precision: str = "fp32", batch_frames: int = 3000, max_segment_s: float | None = None,
                 train_max_s: float | None = None, edge_frames: Sequence[int | Sequence[int]] | None = None,
                 narrowband_trained: bool = False, decode_overrides: Mapping[str, Any] | None = None,
                 num_threads: int | str | None = None, decode_defaults: Mapping[str, Any] | None = None
                 ) -> None:
        check_precision(precision)
        self.edge_frames: EdgeRanges | None = None if edge_frames is None else check_edges(edge_frames,
                                                                                            "edge_frames")
        if max_segment_s is not None and max_segment_s < MIN_SEGMENT_S:
            raise ValueError(f"max_segment_s must be at least {MIN_SEGMENT_S} s, got {max_segment_s}")
        self.device = torch.device(device)
        if num_threads is not None and self.device.type == "cpu":
            if isinstance(num_threads, str) and num_threads != "auto":
                raise ValueError(f"num_threads must be a count, 'auto' or None, got {num_threads!r}")
            apply_threads(None if num_threads == "auto" else int(num_threads), source="num_threads")
        self.max_segment_s, self.train_max_s = max_segment_s, train_max_s
        self.narrowband_trained = bool(narrowband_trained)
        self.model, self.tokenizer = model.to(self.device).eval(), tokenizer
        self.precision = resolve_precision(precision, self.device)
        self.batch_frames = int(batch_frames)
        self.decode_defaults = dict(decode_defaults or {})
        self.config = resolve_search_config(decode_config, self.decode_defaults, **(decode_overrides or {}))
        self.searcher = Searcher(self.model, self.config, self.decode_defaults)
        self.writer = TranscriptWriter(tokenizer, model.token_list if model.token_list is not None
                                       else tokenizer.token_list, model.blank)

    @classmethod
    def from_pretrained(cls, source: PathLike, *, bpemodel: PathLike | None = None, average_nbest: int = 5,
                        max_segment_s: float | str | None = None,
                        edge_frames: Sequence[int | Sequence[int]] | str | None = "model",
                        decode_config: DecodeConfigLike = None, **settings: Any) -> Transcriber:
        """A transcriber for an experiment directory, a checkpoint file or a model shipped with the package.

        Args:
            source: an experiment directory, an avsr or official fine-tuned AV-HuBERT checkpoint
                (:func:`avsr.inference.pretrained.load_pretrained`), or the name of a model shipped in
                ``avsr/pretrained`` (:func:`avsr.pretrained.resolve_model`), whose ``decode.yaml`` is the
                decoding configuration when ``decode_config`` is None.
            bpemodel: the sentencepiece model (default: the experiment directory's, the one beside an avsr
                checkpoint, or the one pickled in an official checkpoint).
            average_nbest: checkpoints averaged from an experiment directory.
            max_segment_s, edge_frames: as the class, or ``"model"``: the model's.
            decode_config, settings: as the class; the checkpoint gives the rest
                (:meth:`avsr.inference.pretrained.Pretrained.settings`).

        Raises:
            FileNotFoundError: no such directory/file, no checkpoint in the directory, no tokenizer; a name
                that is no installed model (one line naming the installed ones).
            avsr.compat.CheckpointError: an unreadable or foreign checkpoint, weights that do not fit.
            ValueError, avsr.config.ConfigError: as the class; another string as ``edge_frames`` or
                ``max_segment_s``.
        """
        source = resolve_model(source)
        loaded = load_pretrained(source, bpemodel, average_nbest)
        return cls(loaded.model, loaded.tokenizer, shipped_decode_config(source) if decode_config is None
                   else decode_config, **loaded.settings(max_segment_s, edge_frames), **settings)

    def __call__(self, video: PathLike | np.ndarray | torch.Tensor | None = None,
                 audio: PathLike | np.ndarray | torch.Tensor | None = None, *, modality: str | None = None,
                 noise: PathLike | torch.Tensor | NoiseSource | None = None, snr_db: float | None = None,
                 key: str | None = None, sample_rate: int | None = None, word_timings: bool = True
                 ) -> Transcript:
        """Transcribe one utterance.

        Args:
            video, audio: the inputs (:mod:`avsr.inference.inputs`); at least one.
            modality: ``audio``, ``video`` or ``audiovisual``; default: what was given.
            noise, snr_db: noise (a 16 kHz wav path, a ``(N,)`` waveform or a :class:`NoiseSource`) mixed
                into the audio at ``snr_db`` dB; the segment is chosen by ``key``.
            key: the utterance's name (default: from the path).
            sample_rate: rate of an ``audio`` array in Hz; None: 16 kHz assumed, and an array whose spectrum
                looks band-limited to 4 kHz (as 8 kHz audio) gets a warning (``info["warning"]``, logged).
            word_timings: compute word timings (models with a CTC head).

        Returns:
            the :class:`Transcript`.

        Raises:
            InferenceError: a bad input (unreadable file, no face, no audio track when audio is needed, an
                empty or one-frame input, NaN/inf samples, a wrong shape or dtype; the message names it).
        """
        item = TranscribeItem(video=video, audio=audio, key=key, sample_rate=sample_rate)
        (result,) = self.transcribe_batch([item], modality=modality, noise=noise, snr_db=snr_db,
                                          strict=True, progress=False, word_timings=word_timings)
        return result

    def transcribe_batch(
        self, items: Sequence[TranscribeItem | Utterance | Mapping[str, Any] | PathLike], *,
        modality: str | None = None, noise: PathLike | torch.Tensor | NoiseSource | None = None,
        snr_db: float | None = None, strict: bool = False, progress: bool | None = None,
        word_timings: bool = True, video_cache: MutableMapping[VersionKey, torch.Tensor] | None = None,
        work_dir: PathLike | None = None, window: int = 512, views: bool = False, report: bool = True,
    ) -> list[Transcript]:
        """Transcribe many utterances, batched over utterances (the batched beam search).

        Items are read ``window`` at a time (all at once when every item has ``num_frames``) and decoded in
        length buckets of at most ``batch_frames`` padded frames (:class:`avsr.inference.batching.Call`).

        Args:
            items: :class:`TranscribeItem` s, :class:`avsr.data.datadir.Utterance` s, mappings of
                :class:`TranscribeItem` fields, or media file paths.
            modality: one for every item, or None: per item, what it has.
            noise, snr_db: as :meth:`__call__`, for every item.
            strict: raise one :class:`InferenceError` naming every bad item.
            progress: a tqdm progress bar (default: for more than 10 items).
            word_timings: compute word timings (models with a CTC head).
            video_cache: the caller's mapping of each item's video front-end output (``(D, T)`` float, CPU),
                for one model and one set of videos with unique keys: decoded again (another noise condition),
                a video is not read again, and where its edges change only frames near its ends are run
                through the front-end (:mod:`avsr.inference.video_cache`).
            work_dir: where raw face videos' ROI mp4 and wav are written (kept); default: a temporary folder.
            window: items read ahead for bucketing when lengths are not known in advance.
            views: keep the transcripts of the single-stream views the ranking searched in
                :attr:`Transcript.views` (:class:`avsr.decode.searcher.SearchResult`): the texts of decoding
                ``modality="video"`` / ``"audio"``, at no extra cost.
            report: log the call's warnings (:func:`avsr.inference.batching.report`); False: the caller
                reports them from the transcripts (``error``, ``info``), as ``avsr transcribe`` does.

        Returns:
            One :class:`Transcript` per item, in order; a bad item has ``error`` set unless ``strict``. An
            audio-visual item whose video cannot be used (:func:`avsr.inference.inputs.load_item`) is decoded
            from its audio alone (``modality`` ``"audio"``, ``info["video_fallback"]``: why).

        Raises:
            InferenceError: with ``strict``, every bad item named; an unknown ``modality``; ``noise`` without
                ``snr_db`` or the other way round; duplicate keys with ``video_cache``.
        """
        if modality is not None and modality not in MODALITY_INPUTS:
            raise InferenceError(f"modality must be one of {list(MODALITY_INPUTS)}, got {modality!r}")
        if (noise is None) != (snr_db is None):
            raise InferenceError("noise and snr_db go together: give both or neither")
        source = noise_source(noise)
        requests = [as_item(x, i) for i, x in enumerate(items)]
        if video_cache is not None and len({r.key for r in requests}) != len(requests):
            raise InferenceError("video_cache needs unique item keys")
        show = progress if progress is not None else len(requests) > 10
        with contextlib.ExitStack() as stack:
            bar = stack.enter_context(tqdm(total=len(requests), desc="transcribe", disable=not show,
                                           dynamic_ncols=True, mininterval=2.0))
            root = Path(work_dir) if work_dir is not None else Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="avsr_transcribe_")))
            call = Call(requests, source, snr_db, video_cache, root, self.edge_frames, bar)
            out = call.run(modality, window, self.max_segment_s, self.batch_frames, self.train_max_s,
                           lambda units, mod: self._decode(units, mod, video_cache, word_timings, views))
        _report(out, strict, self.narrowband_trained, report)
        return out

    @torch.no_grad()
    def _decode(self, units: list[Media], modality: str,
                cache: MutableMapping[VersionKey, torch.Tensor] | None, words: bool, views: bool
                ) -> list[Transcript]:
        """Features, one batched search, and the transcripts of the loaded pieces ``units``."""
        inputs = MODALITY_INPUTS[modality]
        batch = model_inputs(units, inputs, self.device)
        with autocast_context(self.device, self.precision):
            feats = None if "video" not in inputs or cache is None else cached_video_features(
                self.model.encode_video, stem_radius(self.model), units, batch, cache)
            video = batch.video if feats is None else None
            result = self.searcher.decode(batch.audio, video, batch.lengths, feats)
        return self.writer.transcripts(units, result, modality, words, views)
