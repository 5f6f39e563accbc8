"""Transcriber: a model, its tokenizer and a search -- text from audio and/or video, batched over utterances.

ESPnet's ``Speech2Text`` (``espnet2/bin/asr_inference.py``) made smaller. Built from its parts and settings
(:meth:`Transcriber.from_pretrained` for a trained model), it reads the items (:mod:`avsr.inference.inputs`),
cuts long ones and gives them the model's training edges (:mod:`avsr.inference.segments`), batches them by
length (:func:`avsr.data.dataset.length_buckets`), computes the recipe's features (AV-HuBERT's stacked log
filterbanks ``(T, 104)`` at 25 Hz, the 88x88 centre crop of the ROI normalised with mean 0.421 and std 0.165)
and decodes with :class:`avsr.decode.searcher.Searcher` (for audio-visual input of a model with an audio
gate: the fused input's and the video-only view's searches, ranked with the single-stream views' scores);
word timings come from a CTC forced alignment (:mod:`avsr.decode.align`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import tempfile
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
from tqdm import tqdm

from avsr.compat import FairseqTokenizer
from avsr.data.datadir import Utterance
from avsr.data.dataset import length_buckets
from avsr.data.media import MediaError
from avsr.data.noise import NoiseSource
from avsr.data.tokenizer import Tokenizer
from avsr.decode.align import AlignmentError, WordTiming, word_timings
from avsr.decode.config import DecodeConfig, FairseqConfig, SearchConfig, load_decode_config
from avsr.decode.hypothesis import Hypothesis
from avsr.decode.searcher import Searcher
from avsr.features import avhubert_audio_features, crop_video, normalize_video
from avsr.inference.inputs import (
    as_item,
    given_modality,
    load_item,
    noise_source,
    warn_low_rate,
    warn_narrowband,
)
from avsr.inference.pretrained import load_pretrained
from avsr.inference.segments import (
    DEFAULT_SEGMENT_S,
    MIN_SEGMENT_S,
    EdgeRanges,
    check_edges,
    join,
    restore_edges,
    segments,
    shifted,
    stats_edges,
)
from avsr.inference.types import FPS, InferenceError, Media, PathLike, TranscribeItem, Transcript
from avsr.inference.video_cache import VersionKey, stem_radius
from avsr.inference.video_cache import video_features as video_features_of
from avsr.modalities import MODALITY_INPUTS
from avsr.models.asr import AVSRModel
from avsr.nn.precision import autocast_context, check_precision, resolve_precision
from avsr.pretrained import resolve_model, shipped_decode_config
from avsr.threads import apply_threads

__all__ = ["Transcriber"]

logger = logging.getLogger("avsr.inference")

DecodeConfigLike = SearchConfig | Mapping[str, Any] | PathLike | None


@dataclass
class _Call:
    """The state of one :meth:`Transcriber.transcribe_batch` call: its items and results (by index), the
    noise, the caller's video cache, the ROI stage's folder and the progress bar."""

    items: list[TranscribeItem]
    results: list[Transcript | None]
    source: NoiseSource | None
    snr_db: float | None
    want_words: bool
    want_views: bool
    video_cache: MutableMapping[VersionKey, torch.Tensor] | None
    root: Path
    bar: Any

    def done(self, i: int, transcript: Transcript) -> None:
        self.results[i] = transcript
        self.bar.update()


def _by_modality(call: _Call, modality: str | None) -> dict[str, list[int]]:
    """The items' indices by the modality they are decoded in; items without one get their error."""
    groups: dict[str, list[int]] = {}
    for i, item in enumerate(call.items):
        mod = modality or given_modality(item)
        if isinstance(mod, Transcript):
            call.done(i, mod)
        else:
            groups.setdefault(mod, []).append(i)
    return groups

def _report(out: list[Transcript], strict: bool, narrowband_trained: bool, log: bool = True) -> None:
    """The warnings of a :meth:`Transcriber.transcribe_batch` call (narrowband audio, video-only items kept
    as given, audio-visual items decoded audio-only, failed items): in the transcripts' ``info["warning"]``
    (narrowband audio) and, with ``log``, in the log; with ``strict``, InferenceError naming every failed
    item."""
    warn_low_rate(out, narrowband_trained, log)
    warn_narrowband(out, narrowband_trained, log)
    failed = [r for r in out if not r.ok]
    if log:
        kept = [r.key for r in out if r.info.get("edges_note", "").startswith("no audio")]
        if kept:
            logger.warning("%d video-only input(s) without audio (the first: %s) keep their silent edges: "
                           "give the audio too (modality='video') to decode them as the recipe's decoding "
                           "stage does", len(kept), kept[0])
        audio_only = [r for r in out if r.ok and "video_fallback" in r.info]
        if audio_only:
            logger.warning("%d of %d items decoded audio-only: their video could not be used (the first: "
                           "%s: %s)", len(audio_only), len(out), audio_only[0].key,
                           audio_only[0].info["video_fallback"])
        for r in failed:
            logger.warning("%s: %s", r.key, r.error)
        if failed:
            logger.warning("%d of %d items could not be transcribed", len(failed), len(out))
    if failed and strict:
        raise InferenceError("; ".join(r.error for r in failed))


def _batch(units: list[Media], inputs: tuple[str, ...], device: torch.device
           ) -> tuple[torch.Tensor | None, torch.Tensor | None, list[int]]:
    """The model's inputs for ``units``, as the recipe's AVDataset: audio ``(B, 104, T)`` float32 (AV-HuBERT's
    features at 25 Hz) and video ``(b, 1, T, 88, 88)`` float32 (the normalised centre crop) of the units
    whose frames were read (``read``, their indices; the others' video is cached), each None when not
    needed, on ``device``."""
    audio = video = None
    if "audio" in inputs:
        feats = [avhubert_audio_features(m.wav, num_video_frames=m.num_frames) for m in units]
        audio = pad_sequence(feats, batch_first=True).transpose(1, 2).to(device)
    read = [j for j, m in enumerate(units) if m.frames is not None]
    if "video" in inputs and read:
        frames = [normalize_video(crop_video(units[j].frames, train=False)) for j in read]
        video = pad_sequence(frames, batch_first=True).unsqueeze(1).to(device)
    return audio, video, read


class Transcriber:
    """A model, its tokenizer, a search configuration and the preprocessing: text from audio and/or video.

    All settings are given here; the object does not change afterwards.

    Args:
        model: the ASR model (put in eval mode and moved to ``device``).
        tokenizer: :class:`avsr.data.tokenizer.Tokenizer` (avsr models) or
            :class:`avsr.compat.FairseqTokenizer` (official models; their lower-case text is upper-cased).
        decode_config: a :class:`DecodeConfig`, the name of a shipped one (``"default"``,
            ``"avhubert_s2s"``) or a YAML path, a mapping of options over the model's defaults, or None for
            the model's defaults (:meth:`AVSRModel.default_decode_options`: the original's fairseq search for
            official seq2seq models, joint CTC/attention for avsr's).
        device: where the model runs (``"cpu"``, ``"cuda"``).
        precision: ``fp32`` (default: the same WER on every machine), ``bf16`` (the encoder under bf16
            autocast; scores stay float32) or ``auto`` (``bf16`` where the device computes it natively,
            :func:`avsr.nn.precision.resolve_precision`; resolved here, in :attr:`precision`).
        batch_frames: padded 25 fps frames per batch in :meth:`transcribe_batch`.
        max_segment_s: long input: an utterance longer than this (seconds) is cut at pauses into pieces of at
            most this length (:func:`avsr.inference.segments.pause_cuts`), which are decoded batched and
            joined (text, tokens, summed scores, word times offset); None: never cut.
        train_max_s: the longest utterance the model was trained on, in seconds (from the checkpoint, when
            the trainer recorded it); a longer input that is not cut gets a warning (``info["warning"]``).
        edge_frames: ``(start, end)``, each a count of silent 40 ms frames or a range ``(lo, hi)`` of them:
            bring every input's silence before and after its speech into it, normally the middle half of the
            edges of the model's training utterances (see :meth:`from_pretrained`, and
            :mod:`avsr.inference.segments` for how the edges are found and changed, and why a video-only call
            should be given the audio too); the change made is ``info["edges_changed_frames"]``, and
            ``num_frames`` and word timings stay those of the input. None: inputs as given.
        narrowband_trained: whether the model was trained with the 8 kHz channel (the checkpoint's
            ``data_stats["narrowband_prob"]`` > 0, see :meth:`from_pretrained`). When False, audio recorded
            below 16 kHz gets a warning (:func:`avsr.inference.inputs.warn_low_rate`).
        decode_overrides: options applied over ``decode_config`` (e.g. ``{"beam_size": 10}``).
        num_threads: CPU intra-op threads of the process (``torch.set_num_threads``, a process-wide
            setting): None (default) leaves them as they are (torch's default, or your own
            ``torch.set_num_threads``); ``"auto"`` chooses them for the machine as it is, the cores other work
            leaves free (:func:`avsr.threads.apply_threads`, which logs the choice); a count sets it. Ignored
            on a GPU.

    Raises:
        avsr.config.ConfigError: a bad decoding configuration or override (unknown key named).
        ValueError: an unknown precision, bad ``edge_frames`` or ``max_segment_s``, or a search that needs a
            part the model lacks; a ``num_threads`` below 1 or another string than ``"auto"``.
    """

    def __init__(
        self,
        model: AVSRModel,
        tokenizer: Tokenizer | FairseqTokenizer,
        decode_config: DecodeConfigLike = None,
        device: str | torch.device = "cpu",
        precision: str = "fp32",
        batch_frames: int = 3000,
        max_segment_s: float | None = None,
        train_max_s: float | None = None,
        edge_frames: Sequence[int | Sequence[int]] | None = None,
        narrowband_trained: bool = False,
        decode_overrides: Mapping[str, Any] | None = None,
        num_threads: int | str | None = None,
    ) -> None:
        check_precision(precision)
        self.edge_frames: EdgeRanges | None = (
            check_edges(edge_frames, "edge_frames") if edge_frames is not None else None)
        if max_segment_s is not None and max_segment_s < MIN_SEGMENT_S:
            raise ValueError(f"max_segment_s must be at least {MIN_SEGMENT_S} s, got {max_segment_s}")
        self.device = torch.device(device)
        if num_threads is not None and self.device.type == "cpu":
            if isinstance(num_threads, str) and num_threads != "auto":
                raise ValueError(f"num_threads must be a count, 'auto' or None, got {num_threads!r}")
            apply_threads(None if num_threads == "auto" else int(num_threads), source="num_threads")
        self.max_segment_s = max_segment_s
        self.train_max_s = train_max_s
        self.narrowband_trained = bool(narrowband_trained)
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.precision = resolve_precision(precision, self.device)
        self.batch_frames = int(batch_frames)
        self.config = self._decode_config(decode_config, dict(decode_overrides or {}))
        self.searcher = Searcher(self.model, self.config)  # the search and the ranking with the views
        self._upper = isinstance(tokenizer, FairseqTokenizer)
        token_list = model.token_list if model.token_list is not None else tokenizer.token_list
        self._token_list = list(token_list)

    def _decode_config(self, config: DecodeConfigLike, overrides: dict[str, Any]) -> SearchConfig:
        if isinstance(config, (str, os.PathLike)):
            config = load_decode_config(config)
        if isinstance(config, (DecodeConfig, FairseqConfig)):
            return self.model.search_config(config, **overrides) if overrides else config
        return self.model.search_config(None, **{**dict(config or {}), **overrides})

    @classmethod
    def from_pretrained(
        cls,
        source: PathLike,
        *,
        bpemodel: PathLike | None = None,
        device: str | torch.device = "cpu",
        decode_config: DecodeConfigLike = None,
        average_nbest: int = 5,
        precision: str = "fp32",
        batch_frames: int = 3000,
        max_segment_s: float | str | None = None,
        edge_frames: Sequence[int | Sequence[int]] | str | None = "model",
        decode_overrides: Mapping[str, Any] | None = None,
        num_threads: int | str | None = None,
    ) -> Transcriber:
        """A transcriber for an experiment directory, a checkpoint file or a model shipped with the package.

        Args:
            source: an experiment directory (its ``average_nbest`` best checkpoints averaged), an avsr
                checkpoint or an official fairseq AV-HuBERT fine-tuned checkpoint, seq2seq or CTC
                (:func:`avsr.inference.pretrained.load_pretrained`), or the name of a model shipped in
                ``avsr/pretrained`` (``"synthgrid"``, :func:`avsr.pretrained.resolve_model`: an existing path
                wins over a name). A shipped model's ``decode.yaml`` is its decoding configuration when
                ``decode_config`` is None.
            bpemodel: the sentencepiece model (default: the experiment directory's, the one beside an avsr
                checkpoint, or the one pickled in an official checkpoint).
            device, decode_config, precision, batch_frames, decode_overrides, num_threads: as the class.
            average_nbest: checkpoints averaged from an experiment directory.
            max_segment_s: as the class, or ``"model"``: the longest training utterance when the trainer
                recorded it, else :data:`avsr.inference.segments.DEFAULT_SEGMENT_S` (15 s).
            edge_frames: as the class, or ``"model"``: the first to third quartile of the silent edges of the
                model's training audio, from the checkpoint's ``data_stats`` when the trainer recorded them,
                else None (official checkpoints, older avsr models: inputs as given).

        The longest training utterance (``train_max_s`` of the class) and whether the model heard narrowband
        audio (``narrowband_trained``) come from the checkpoint's ``data_stats`` when recorded.

        Raises:
            FileNotFoundError: no such directory/file, no checkpoint in the directory, no tokenizer; a name
                that is no installed model (one line naming the installed ones).
            avsr.compat.CheckpointError: an unreadable or foreign checkpoint, weights that do not fit.
            ValueError, avsr.config.ConfigError: as the class; another string as ``edge_frames`` or
                ``max_segment_s``.
        """
        source = resolve_model(source)
        if decode_config is None:
            decode_config = shipped_decode_config(source)
        model, tokenizer, stats = load_pretrained(source, bpemodel, average_nbest)
        train_max_s = stats["max_frames"] / FPS if stats.get("max_frames") else None
        if isinstance(edge_frames, str):
            if edge_frames != "model":
                raise ValueError(f"edge_frames must be 'model', None or (start, end), got {edge_frames!r}")
            edge_frames = stats_edges(stats)
            if edge_frames is not None:
                logger.info("inputs get the silent edges of the training audio: %d-%d frames (40 ms) before "
                            "the speech, %d-%d after", *edge_frames[0], *edge_frames[1])
        if isinstance(max_segment_s, str):
            if max_segment_s != "model":
                raise ValueError(f"max_segment_s must be 'model', None or seconds, got {max_segment_s!r}")
            max_segment_s = train_max_s or DEFAULT_SEGMENT_S
        return cls(model, tokenizer, decode_config, device, precision, batch_frames, max_segment_s,
                   train_max_s, edge_frames, narrowband_trained=bool(stats.get("narrowband_prob")),
                   decode_overrides=decode_overrides, num_threads=num_threads)

    def __call__(
        self,
        video: PathLike | np.ndarray | torch.Tensor | None = None,
        audio: PathLike | np.ndarray | torch.Tensor | None = None,
        *,
        modality: str | None = None,
        noise: PathLike | torch.Tensor | NoiseSource | None = None,
        snr_db: float | None = None,
        key: str | None = None,
        sample_rate: int | None = None,
        word_timings: bool = True,
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
        self,
        items: Sequence[TranscribeItem | Utterance | Mapping[str, Any] | PathLike],
        *,
        modality: str | None = None,
        noise: PathLike | torch.Tensor | NoiseSource | None = None,
        snr_db: float | None = None,
        strict: bool = False,
        progress: bool | None = None,
        word_timings: bool = True,
        video_cache: MutableMapping[VersionKey, torch.Tensor] | None = None,
        work_dir: PathLike | None = None,
        window: int = 512,
        views: bool = False,
        report: bool = True,
    ) -> list[Transcript]:
        """Transcribe many utterances, batched over utterances (the batched beam search).

        Items are read ``window`` at a time (all at once when every item has ``num_frames``), bucketed by
        length into batches of at most ``batch_frames`` padded frames
        (:func:`avsr.data.dataset.length_buckets`; a longer utterance is a batch of its own) and decoded.

        Args:
            items: :class:`TranscribeItem`, :class:`avsr.data.datadir.Utterance` (its ``wav``, ``video``,
                ``utt_id``, ``num_frames``), mappings with the fields of :class:`TranscribeItem`, or paths (a
                media file: its video stream and its audio stream, whichever it has).
            modality: one for every item, or None: per item, what it has.
            noise, snr_db: as :meth:`__call__`, for every item.
            strict: raise one :class:`InferenceError` naming every bad item instead of returning them with
                ``error`` set.
            progress: a tqdm progress bar (default: for more than 10 items).
            word_timings: compute word timings (models with a CTC head).
            video_cache: a mapping owned by the caller that keeps each item's video front-end output
                (``(D, T)`` float, on the CPU) under its key and the change of its edges
                (:func:`avsr.inference.video_cache.version_key`); when the same videos are decoded again
                (another noise condition of the audio), the video is neither read nor run through the
                front-end, and where the edges found in the new audio differ, only the frames near the ends
                are (:func:`avsr.inference.video_cache.video_features`). Keys must be unique and the mapping
                used with one model and one set of videos.
            work_dir: where raw face videos' ROI mp4 and wav are written (kept); default: a temporary folder.
            window: items read ahead for bucketing when lengths are not known in advance.
            views: keep, in each audio-visual transcript's :attr:`Transcript.views`, the transcripts of the
                single-stream views that the ranking searched (``"video"`` with ``video_weight`` > 0,
                ``"audio"`` with the confidence check; :class:`avsr.decode.searcher.Searcher`): the same texts
                as transcribing the item with ``modality="video"`` / ``"audio"``, at no extra cost (the
                recipe's decoding stage writes all three modalities from one audio-visual pass).
            report: log the call's warnings (each failed item and their count, items decoded audio-only,
                video-only items that keep their edges, narrowband audio); False: log none of them, the
                caller reports them from the transcripts (``error``, ``info``) itself, as ``avsr transcribe``
                does (``info["warning"]`` is set either way).

        Returns:
            One :class:`Transcript` per item, in the order of ``items``; a bad item has ``error`` set (and is
            logged) unless ``strict``. An audio-visual item whose video cannot be used (unreadable, no face,
            too few frames: :func:`avsr.inference.inputs.load_item`) is decoded from its audio alone: its
            transcript has ``modality`` ``"audio"`` and ``info["video_fallback"]`` the reason (logged, with
            the count, in one warning).

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
        bar = tqdm(total=len(requests), desc="transcribe", disable=not show, dynamic_ncols=True,
                   mininterval=2.0)
        with contextlib.ExitStack() as stack:
            root = Path(work_dir) if work_dir is not None else Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="avsr_transcribe_")))
            call = _Call(requests, [None] * len(requests), source, snr_db, word_timings, views, video_cache,
                         root, bar)
            for mod, indices in _by_modality(call, modality).items():
                known = all(requests[i].num_frames is not None for i in indices)
                step = len(indices) if known else max(1, window)
                for start in range(0, len(indices), step):
                    self._run_chunk(call, indices[start : start + step], mod)
        bar.close()
        out = [r for r in call.results if r is not None]
        _report(out, strict, self.narrowband_trained, report)
        return out

    def _load(self, call: _Call, i: int, modality: str, whole: bool = False) -> Media | None:
        """Item ``i`` read for ``modality`` (``whole``: its edges changed too), or None with its error
        recorded."""
        item = call.items[i]
        try:
            media = load_item(item, MODALITY_INPUTS[modality], call.root / f"{i:05d}_{item.key}",
                              video_cache=call.video_cache, source=call.source, snr_db=call.snr_db,
                              edge_frames=self.edge_frames)
            return shifted(media, self.edge_frames) if whole else media
        except (InferenceError, MediaError, ValueError) as exc:
            message = str(exc) if item.key in str(exc) else f"{item.key}: {exc}"
            call.done(i, Transcript(key=item.key, modality=modality, error=message))
            return None

    def _run_chunk(self, call: _Call, chunk: list[int], modality: str) -> None:
        """Read, cut, bucket and decode the items ``chunk`` (indices into ``call.items``) under one modality.

        Items whose length is known and needs no cutting are read batch by batch; the others are read first
        (long ones cut into segments). Every piece is a unit of the length buckets.
        """
        limit = int(self.max_segment_s * FPS) if self.max_segment_s is not None else None
        units: list[tuple[int, int, Media | None]] = []  # (item, length, media or None: read later)
        pieces: dict[int, int] = {}
        for i in chunk:
            hint = call.items[i].num_frames
            if hint is not None and (limit is None or hint <= limit):
                units.append((i, int(hint), None))
                pieces[i] = 1
                continue
            m = self._load(call, i, modality)
            if m is None:
                continue
            try:
                cut = segments(m, limit, self.edge_frames, self.train_max_s)
            except InferenceError as exc:
                call.done(i, Transcript(key=m.key, modality=modality, error=str(exc)))
                continue
            units += [(i, seg.num_frames, seg) for seg in cut]
            pieces[i] = len(cut)
        parts: dict[int, list[tuple[int, Transcript]]] = {}
        for batch in length_buckets([n for _, n, _ in units], self.batch_frames, oversize="alone"):
            todo = [(units[j][0], units[j][2] or self._load(call, units[j][0], modality, whole=True))
                    for j in batch]
            todo = [(i, m) for i, m in todo if m is not None]
            # an audio-visual item whose video cannot be used is decoded from its audio alone
            fallback = [(i, m) for i, m in todo if "video_fallback" in m.info]
            todo = [(i, m) for i, m in todo if "video_fallback" not in m.info]
            for group, mod in ((todo, modality), (fallback, "audio")):
                if not group:
                    continue
                transcripts = self._decode([m for _, m in group], mod, call)
                for (i, m), transcript in zip(group, transcripts):
                    parts.setdefault(i, []).append((m.offset, transcript))
                    if len(parts[i]) == pieces[i]:
                        call.done(i, join(call.items[i].key, parts.pop(i)))

    @torch.no_grad()
    def _decode(self, units: list[Media], modality: str, call: _Call) -> list[Transcript]:
        """Features, one batched search, texts and word timings for the loaded pieces ``units``."""
        inputs, cache = MODALITY_INPUTS[modality], call.video_cache
        keys = [m.cache_key for m in units]
        audio, video, read = _batch(units, inputs, self.device)
        lengths = torch.tensor([m.num_frames for m in units], dtype=torch.long).to(self.device)
        video_features = None
        with autocast_context(self.device, self.precision):
            if "video" in inputs and cache is not None:
                # the videos read: through the front-end, or made from another version of their edges
                made = {} if video is None else dict(zip(read, video_features_of(
                    self.model.encoder.encode_video, video, [units[j].num_frames for j in read],
                    [units[j].video_id for j in read], [units[j].change for j in read], cache,
                    stem_radius(self.model))))
                feats = [(made[j] if j in made else cache[k]).transpose(0, 1) for j, k in enumerate(keys)]
                video_features = pad_sequence(feats, batch_first=True).transpose(1, 2).to(self.device)
            view_hyps: dict[str, list[list[Hypothesis]]] | None = {} if call.want_views else None
            gates: dict[str, torch.Tensor] = {}
            hyps, ctc_logp, enc_lens = self.searcher.decode(
                audio, None if video_features is not None else video, lengths, video_features, view_hyps,
                gates)
        out = []
        for j, m in enumerate(units):
            t = self._transcript(m, hyps[j], modality)
            t.info.update({name: round(float(value[j]), 4) for name, value in gates.items()})
            if call.want_words:
                t.words = self._words(ctc_logp, enc_lens, j, t.tokens, t.info)
            if view_hyps:
                t.views = {name: restore_edges(self._transcript(m, lists[j], name), m.change)
                           for name, lists in view_hyps.items()}
            out.append(restore_edges(t, m.change))
        return out

    def _transcript(self, m: Media, hyps: list[Hypothesis], modality: str) -> Transcript:
        """The transcript of piece ``m`` from its best hypothesis (if any), before :func:`restore_edges`."""
        best = hyps[0] if hyps else None
        tokens = list(best.tokens) if best is not None else []
        return Transcript(key=m.key, text=self._text(tokens), tokens=tokens,
                          score=float(best.score) if best is not None else math.nan, modality=modality,
                          num_frames=m.num_frames, info=dict(m.info))

    def _words(self, ctc_logp: torch.Tensor | None, enc_lens: torch.Tensor, j: int, tokens: list[int],
               info: dict[str, Any]) -> list[WordTiming] | None:
        """Word timings of hypothesis ``tokens`` of batch item ``j`` (CTC forced alignment), or None with
        ``info["words_note"]`` saying why."""
        if ctc_logp is None:
            info["words_note"] = "the model has no CTC head: no word timings"
            return None
        try:
            frame_logp = ctc_logp[j, : int(enc_lens[j])].float()
            return word_timings(frame_logp, tokens, self._token_list, blank=self.model.blank,
                                decode=self._text)
        except AlignmentError as exc:
            info["words_note"] = f"no word timings: {exc}"
            return None

    def _text(self, tokens: Iterable[int]) -> str:
        text = self.tokenizer.decode(list(tokens))
        return text.upper() if self._upper else text
