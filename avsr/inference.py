"""Transcriber: the one inference path -- checkpoint(s) + tokenizer + preprocessing + beam search.

ESPnet's ``Speech2Text`` (``espnet2/bin/asr_inference.py``) made smaller: :meth:`Transcriber.from_pretrained`
loads a model (an experiment directory, whose best checkpoints are averaged; an avsr checkpoint; an official
fairseq AV-HuBERT fine-tuned checkpoint), :meth:`Transcriber.__call__` transcribes one utterance and
:meth:`Transcriber.transcribe_batch` many, batched over utterances. The recipe's decoding stage
(``python -m avsr.bin.decode``), ``avsr transcribe`` and Python users all go through this class, so a file
gives the same words whichever way it is decoded.

Inputs, per utterance (:class:`TranscribeItem`):

* video: a path -- a preprocessed mouth ROI (a video of exactly 96x96 pixels, as AV-HuBERT's preprocessed
  LRS3) or a raw face video (anything else: the ROI stage, :func:`avsr.data.roi.preprocess_video`, runs and
  its output is read back, exactly what the recipe's ROI stage writes) -- or an array: uint8 ROI frames
  ``(T, H, W)`` with ``H, W >= 88`` (96x96 for AV-HuBERT's ROIs) at 25 fps, or uint8 RGB face frames
  ``(T, H, W, 3)`` at 25 fps (ROI extraction in memory);
* audio: a path -- a 16 kHz mono wav/flac is read as is, other rates and formats (any container FFmpeg reads)
  are decoded, downmixed and resampled to 16 kHz; the audio track of a video file is cut or zero-padded to
  its 25 fps frame count and stored as 16-bit PCM, as the ROI stage does -- or a float waveform ``(N,)`` at
  16 kHz (another ``sample_rate`` is resampled).

From the raw media on, everything is the recipe's: AV-HuBERT's stacked log filterbanks (``(T, 104)`` at
25 Hz, padded or cut to the video's frame count), the 88x88 centre crop of the ROI normalised with mean
0.421 and std 0.165, noise mixed at an SNR with the segment chosen by the utterance's key (as the recipe's
test conditions), the silence before and after the speech brought into the range of the model's training
audio where the audio shows it (``edge_frames``), length-bucketed batches, and
:class:`avsr.decode.searcher.Searcher` (for audio-visual input of a model with an audio gate: the fused
input's and the video-only view's searches, ranked with the single-stream views' scores,
``DecodeConfig.video_weight`` and ``audio_weight``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import tempfile
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
from tqdm import tqdm

from avsr.compat import FairseqTokenizer, read_checkpoint, tokenizer_for
from avsr.data.datadir import Utterance
from avsr.data.dataset import length_buckets
from avsr.data.media import (
    MediaError,
    pcm16_round_trip,
    read_audio_track,
    read_video,
    read_video_rgb,
    read_wav,
    video_fps,
)
from avsr.data.noise import NoiseSource
from avsr.data.tokenizer import Tokenizer
from avsr.decode.align import AlignmentError, WordTiming, word_timings
from avsr.decode.config import DecodeConfig, FairseqConfig, SearchConfig, load_decode_config
from avsr.decode.searcher import Searcher
from avsr.features import (
    SAMPLES_PER_FRAME,
    avhubert_audio_features,
    crop_video,
    edge_ranges,
    edge_shift,
    normalize_video,
    own_silence,
    shift_edges,
)
from avsr.modalities import MODALITY_INPUTS
from avsr.models.asr import AVSRModel
from avsr.nn.precision import autocast_context, check_precision, resolve_precision
from avsr.train.checkpoint import average_state_dicts, best_checkpoints, load_checkpoint

__all__ = [
    "InferenceError", "Transcript", "TranscribeItem", "Transcriber", "frame_energy_db",
    "frame_motion", "model_defaults", "model_edge_frames", "model_view_weights", "parse_edge_frames",
    "pause_cuts",
]

logger = logging.getLogger("avsr.inference")

#: video frame rate of every model input (frames per second).
FPS = 25.0
#: input sample rate of every model (Hz).
SAMPLE_RATE = 16000
#: side of the mouth ROI of AV-HuBERT's preprocessing, in pixels; a video of this size is taken as a ROI.
ROI_SIZE = 96
#: the fewest 25 fps frames an utterance may have.
MIN_FRAMES = 2
#: largest difference, in frames, between the audio (samples / 640) and the video of one utterance
#: (as :class:`avsr.data.dataset.AVDataset`'s ``max_frame_diff``).
MAX_FRAME_DIFF = 2
#: most silent frames (40 ms) :class:`Transcriber`'s ``edge_frames`` may ask for at each end (2 s).
MAX_EDGE_FRAMES = 50

PathLike = str | os.PathLike


class InferenceError(ValueError):
    """An input cannot be transcribed; the message names the input (file or item key) and the reason."""


@dataclass
class TranscribeItem:
    """One utterance to transcribe (see the module docstring for what each input may be).

    Attributes:
        video: path or uint8 array/tensor ``(T, H, W)`` ROI / ``(T, H, W, 3)`` RGB frames at 25 fps, or None.
        audio: path or float waveform ``(N,)`` (at ``sample_rate``), or None.
        key: the utterance's name in results, errors, noise-segment choice and the video cache (default: the
            stem of the video path, else of the audio path, else ``utt<index>``).
        num_frames: its length in 25 fps frames if known (e.g. ``utt2num_frames``): batches are then formed
            before any file is read.
        sample_rate: rate of an ``audio`` array in Hz (resampled to 16 kHz).
    """

    video: PathLike | np.ndarray | torch.Tensor | None = None
    audio: PathLike | np.ndarray | torch.Tensor | None = None
    key: str | None = None
    num_frames: int | None = None
    sample_rate: int = SAMPLE_RATE


@dataclass
class Transcript:
    """The transcription of one utterance.

    Attributes:
        key: the item's key.
        text: the words (upper case, as avsr's references; "" when the search found nothing or on error).
        tokens: the hypothesis' token ids (without sos/eos/blank).
        score: the hypothesis' total search score (log domain; nan on error or without hypothesis).
        words: word timings in seconds from a CTC forced alignment (:mod:`avsr.decode.align`), or None (no CTC
            head, not asked for, or the alignment failed: ``info["words_note"]`` says why).
        modality: ``audio``, ``video`` or ``audiovisual``.
        num_frames: the input's length in 25 fps frames.
        info: facts about the input (``frames_without_face``, ``audio_padded_s``, ``resampled_from_hz``,
            ``noise``, ``snr_db``, ``words_note``, ``edges_changed_frames``, ``edges_note``) and ``warning``
            (an input longer than the model's training utterances, audio recorded below 16 kHz).
        error: why the item could not be transcribed, or None.
    """

    key: str
    text: str = ""
    tokens: list[int] = field(default_factory=list)
    score: float = math.nan
    words: list[WordTiming] | None = None
    modality: str = ""
    num_frames: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Whether the item was transcribed."""
        return self.error is None

    @property
    def duration_s(self) -> float:
        """The input's length in seconds (``num_frames / 25``)."""
        return self.num_frames / FPS

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (words as ``{"word", "start", "end", "score"}``)."""
        out = {"key": self.key, "text": self.text, "tokens": list(self.tokens), "score": self.score,
               "modality": self.modality, "duration_s": round(self.duration_s, 3),
               "words": [w.to_dict() for w in self.words] if self.words is not None else None, **self.info}
        if self.error is not None:
            out["error"] = self.error
        return out


@dataclass
class _Media:
    """Raw media of one item or one segment of it: ``wav`` (N,) float32 16 kHz (noise already mixed) or None,
    ``frames`` (T, H, W) uint8 ROI or None; ``offset``: its first frame in the item (25 fps); ``cache_key``:
    its entry in the video cache (the key, with the change of its edges when there is one); ``change``: the
    change of its edges (:func:`avsr.features.edge_shift`) still to make (from :meth:`Transcriber._load`) or
    made (a unit to decode), or None."""

    key: str
    wav: torch.Tensor | None
    frames: torch.Tensor | None
    num_frames: int
    info: dict[str, Any]
    offset: int = 0
    cache_key: str = ""
    change: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        self.cache_key = self.cache_key or self.key


def _name(source: Any) -> str:
    return str(source) if isinstance(source, (str, os.PathLike)) else f"<{type(source).__name__}>"


def _streams(path: Path) -> tuple[bool, tuple[int, int] | None]:
    """(has an audio stream, (width, height) of its video stream or None). Raises InferenceError."""
    import av

    if not path.is_file():
        raise InferenceError(f"{path}: no such file")
    try:
        with av.open(str(path)) as container:
            video = container.streams.video
            size = (video[0].codec_context.width, video[0].codec_context.height) if video else None
            return bool(container.streams.audio), size
    except Exception as exc:  # av.error.FFmpegError and friends
        raise InferenceError(f"{path}: cannot read this file as audio or video ({exc})") from exc


def _to_tensor(array: Any, what: str, key: str) -> torch.Tensor:
    if isinstance(array, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(array))
    if isinstance(array, torch.Tensor):
        return array.detach().cpu()
    raise InferenceError(
        f"{key}: {what} must be a path, a numpy array or a tensor, got {type(array).__name__}")


def _check_waveform(wav: torch.Tensor, key: str, source: str) -> torch.Tensor:
    if wav.dim() == 2 and 1 in wav.shape:
        wav = wav.reshape(-1)
    if wav.dim() != 1:
        raise InferenceError(f"{key}: the waveform {source} must be mono (N,), got shape {tuple(wav.shape)}")
    if not wav.is_floating_point():
        raise InferenceError(f"{key}: the waveform {source} must be float in [-1, 1], got {wav.dtype}")
    if wav.numel() == 0:
        raise InferenceError(f"{key}: the audio {source} is empty")
    if not bool(torch.isfinite(wav).all()):
        raise InferenceError(f"{key}: the audio {source} has NaN or infinite samples")
    return wav.to(torch.float32)


def _read_audio_file(path: Path, key: str) -> tuple[torch.Tensor, dict[str, Any]]:
    """A 16 kHz mono file as is; any other rate/format decoded, downmixed and resampled to 16 kHz."""
    import soundfile

    try:
        info = soundfile.info(str(path))
    except Exception:  # not a format libsndfile reads (mp3, mp4, ...): FFmpeg
        info = None
    if info is not None and info.samplerate == SAMPLE_RATE and info.channels == 1:
        return read_wav(path), {}
    wav = read_audio_track(path, SAMPLE_RATE)
    resampled = info is not None and info.samplerate != SAMPLE_RATE
    note = {"resampled_from_hz": info.samplerate} if resampled else {}
    return wav, note


def frame_energy_db(wav: torch.Tensor) -> torch.Tensor:
    """Energy of each 25 fps frame (640 samples at 16 kHz) of a waveform ``(N,)``, in dB: ``(ceil(N / 640),)``
    float32 (``10 log10(mean square + 1e-10)``), the activity :func:`pause_cuts` reads for audio."""
    pad = (-wav.numel()) % SAMPLES_PER_FRAME
    frames = torch.nn.functional.pad(wav.float(), (0, pad)).view(-1, SAMPLES_PER_FRAME)
    return 10.0 * torch.log10(frames.pow(2).mean(dim=1) + 1e-10)


def frame_motion(frames: torch.Tensor) -> torch.Tensor:
    """Mouth motion of each frame of ROI frames ``(T, H, W)`` uint8: the mean absolute gray difference to the
    previous frame, ``(T,)`` float32 (0 for the first): the activity :func:`pause_cuts` reads for video
    alone."""
    diff = (frames[1:].float() - frames[:-1].float()).abs().mean(dim=(1, 2))
    return torch.cat([diff.new_zeros(1), diff])


def pause_cuts(activity: torch.Tensor, max_frames: int, min_fraction: float = 0.5) -> list[int]:
    """Where to cut a long input into pieces of at most ``max_frames`` frames: at pauses.

    Greedy from the start: the next cut is in the pause of least ``activity`` (smoothed over 3 frames) between
    ``min_fraction * max_frames`` and ``max_frames`` frames after the previous cut -- at the middle of the run
    of frames around the minimum that stay within 10% of the window's range above it, so that neither piece
    loses the faint ends of its words (a final release, a soft onset); the last piece is what remains (at most
    ``max_frames``).

    Args:
        activity: ``(T,)`` per-frame activity (:func:`frame_energy_db`, :func:`frame_motion`).
        max_frames: the longest piece, in frames (>= 2).
        min_fraction: the shortest piece (but the last) as a fraction of ``max_frames``.

    Returns:
        The cut frames, increasing (each starts a new piece); empty when ``T <= max_frames``.
    """
    num = int(activity.numel())
    smooth = torch.nn.functional.avg_pool1d(activity.float().view(1, 1, -1), 3, 1, 1, count_include_pad=False)
    smooth = smooth[0, 0]
    cuts, start = [], 0
    low = max(1, int(min_fraction * max_frames))
    while num - start > max_frames:
        window = smooth[start + low : start + max_frames + 1]
        m = int(torch.argmin(window))
        loud = (window > window[m] + 0.1 * (window.max() - window[m])).nonzero().flatten()
        a = int(loud[loud < m].max()) + 1 if bool((loud < m).any()) else 0  # the quiet run around m: [a, b]
        b = int(loud[loud > m].min()) - 1 if bool((loud > m).any()) else window.numel() - 1
        cut = start + low + (a + b + 1) // 2
        cuts.append(cut)
        start = cut
    return cuts


#: the edges of :class:`Transcriber`: per end (start, end) the range ``(lo, hi)`` of silent 40 ms frames.
EdgeRanges = tuple[tuple[int, int], tuple[int, int]]


def _edge_ranges(value: Any, what: str) -> EdgeRanges:
    """:func:`avsr.features.edge_ranges` with the ``MAX_EDGE_FRAMES`` limit; ValueError naming ``what``."""
    try:
        ranges = edge_ranges(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be (start, end) with each a count of 40 ms frames or a range "
                         f"(lo, hi), 0 <= lo <= hi <= {MAX_EDGE_FRAMES}, got {value!r}") from None
    if max(ranges[0][1], ranges[1][1]) > MAX_EDGE_FRAMES:
        raise ValueError(f"{what} must be at most {MAX_EDGE_FRAMES} frames at each end, got {value!r}")
    return ranges


def parse_edge_frames(text: str) -> EdgeRanges | str | None:
    """The ``edge_frames`` of :meth:`Transcriber.from_pretrained` from a command-line value: ``model`` (the
    model's training edges), ``off`` (None: inputs as given), or ``START,END`` with each a count of silent
    40 ms frames (``5,4``) or a range ``LO-HI`` (``4-6,3-5``).

    Raises:
        ValueError: anything else (the value named).
    """
    text = text.strip()
    if text in ("model", "off"):
        return None if text == "off" else text
    try:
        ends = [tuple(int(x) for x in part.split("-")) for part in text.split(",")]
        value = [e[0] if len(e) == 1 else e for e in ends]
    except ValueError:
        value = None
    if value is None or any(len(e) > 2 for e in ends):
        raise ValueError(f"edge frames must be 'model', 'off' or START,END with each a count of 40 ms frames "
                         f"or a range LO-HI, got {text!r}")
    return _edge_ranges(value, "edge frames")


def model_edge_frames(source: PathLike, average_nbest: int = 5) -> EdgeRanges | None:
    """The silent edges of a model's training audio as its trainer recorded them
    (``data_stats["edge_frames"]``: the first to third quartile of the silent frames at the start and at the
    end), or None (not recorded:
    official checkpoints, avsr models trained before 2026-11-26, video-only training). ``source`` as
    :meth:`Transcriber.from_pretrained`.

    Raises:
        FileNotFoundError: no such directory/file or no checkpoint in it;
        avsr.compat.CheckpointError: an unreadable checkpoint file.
    """
    return model_defaults(source, average_nbest)[0]


def model_view_weights(source: PathLike, average_nbest: int = 5) -> tuple[float, float]:
    """The ``(video_weight, audio_weight)`` that a search config leaving them None gives this model: its
    ``decode_defaults`` (:class:`avsr.decode.searcher.Searcher`), else 0, read from the checkpoint's model
    configuration without building the model. ``source`` as
    :meth:`Transcriber.from_pretrained`.

    Raises:
        as :func:`model_edge_frames`.
    """
    return model_defaults(source, average_nbest)[1]


def model_defaults(source: PathLike, average_nbest: int = 5
                   ) -> tuple[EdgeRanges | None, tuple[float, float]]:
    """:func:`model_edge_frames` and :func:`model_view_weights` from one read of the checkpoint (the first
    of an experiment directory's best, or the file).

    Raises:
        as :func:`model_edge_frames`.
    """
    source = Path(source)
    if source.is_dir():
        first = load_checkpoint(best_checkpoints(source, average_nbest)[0])
        stats, config = first.get("data_stats") or {}, first.get("model_config")
    elif source.is_file():
        loaded = read_checkpoint(source)
        stats, config = loaded.data_stats or {}, loaded.model_config
    else:
        raise FileNotFoundError(f"no such experiment directory or checkpoint: {source}")
    defaults = (config or {}).get("decode_defaults") or {}
    weights = (float(defaults.get("video_weight") or 0.0), float(defaults.get("audio_weight") or 0.0))
    return _stats_edges(stats), weights


def _stats_edges(stats: Mapping[str, Any]) -> EdgeRanges | None:
    """The edges of a checkpoint's ``data_stats`` (ranges, or single counts as written on 2026-11-26)."""
    edges = stats.get("edge_frames")
    return _edge_ranges([e if isinstance(e, int) else tuple(e) for e in edges], "data_stats edge_frames") \
        if edges else None


class Transcriber:
    """A model, its tokenizer, a search configuration and the preprocessing: text from audio and/or video.

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
            most this length (:func:`pause_cuts`), which are decoded batched and joined (text, tokens, summed
            scores, word times offset); None: never cut.
        train_max_s: the longest utterance the model was trained on, in seconds (from the checkpoint, when
            the trainer recorded it); a longer input that is not cut gets a warning (``info["warning"]``).
        edge_frames: ``(start, end)``, each a count of silent 40 ms frames or a range ``(lo, hi)`` of them:
            bring every input's silence before and after its speech into it (:func:`avsr.features.edge_shift`:
            silent frames beyond ``hi`` removed, frames missing to ``lo`` added as copies of the input's own
            silence, :func:`avsr.features.own_silence`, the video's edge frame repeated), normally the middle
            half of the edges of the model's training utterances (``data_stats["edge_frames"]``, see
            :meth:`from_pretrained`); a model trained on
            utterances with regular pauses at their ends reads the words by them (recipes/synthgrid/avsr1/
            RESULTS.md, "Silence at the edges"). The edges are found in the audio as decoded (noise mixed
            in; for a video-only decode, the item's audio with the same noise, read only for this); audio
            whose quietest frame is less than 40 dB below its loudest (noise under the whole recording)
            and video-only items without audio keep theirs (``info["edges_note"]``, and one log line per
            call). The change made is ``info["edges_changed_frames"]``; ``num_frames`` and word timings stay
            those of the input. None: inputs as given.

            Video-only input and the recipe's decoding stage: ``avsr.bin.decode`` gives every utterance its
            ``wav.scp`` audio, so its video-only hypotheses are those of a call given the audio as well,
            ``transcriber(video=mp4, audio=wav, modality="video")`` (the audio then only places the edges,
            the model sees the video alone). A call given the video alone cannot find the edges and decodes
            the video as recorded: its hypotheses differ from the stage's wherever the stage changes the
            edges (9 of 12 utterances with random silent edges, for a tiny random model). Both agree when
            the edges are off (``edge_frames=None``, the stage's ``--edge-frames off``), or for a model
            whose checkpoint records no edges.
        narrowband_trained: whether the model was trained with the 8 kHz channel (the checkpoint's
            ``data_stats["narrowband_prob"]`` > 0, see :meth:`from_pretrained`; a training corpus that is
            band-limited itself, such as SynthGRID's many-voice corpus, is not known here). When False,
            audio recorded below 16 kHz (``info["resampled_from_hz"]``: no frequencies above half that rate)
            gets a warning (``info["warning"]``, and one log line per call naming the lowest-rate input): a
            model trained on full-band audio misreads it (SynthGRID's default: 22% WER at 8 kHz against 2.7%
            as recorded, recipes/synthgrid/avsr1/RESULTS.md, "Narrowband audio").

    Raises:
        avsr.config.ConfigError: a bad decoding configuration (unknown key named).
        ValueError: an unknown precision, bad ``edge_frames``, or a search that needs a part the model lacks.
    """

    def __init__(
        self,
        model: AVSRModel,
        tokenizer: Tokenizer | FairseqTokenizer,
        decode_config: SearchConfig | Mapping[str, Any] | PathLike | None = None,
        device: str | torch.device = "cpu",
        precision: str = "fp32",
        batch_frames: int = 3000,
        max_segment_s: float | None = None,
        train_max_s: float | None = None,
        edge_frames: Sequence[int | Sequence[int]] | None = None,
        narrowband_trained: bool = False,
    ) -> None:
        check_precision(precision)
        self.edge_frames: EdgeRanges | None = (
            _edge_ranges(edge_frames, "edge_frames") if edge_frames is not None else None)
        if max_segment_s is not None and max_segment_s * FPS < 2 * MIN_FRAMES:
            raise ValueError(f"max_segment_s must be at least {2 * MIN_FRAMES / FPS} s, got {max_segment_s}")
        self.device = torch.device(device)
        self.max_segment_s = max_segment_s
        self.train_max_s = train_max_s
        self.narrowband_trained = bool(narrowband_trained)
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.precision = resolve_precision(precision, self.device)
        self.batch_frames = int(batch_frames)
        self.config = self._decode_config(decode_config)
        self.searcher = Searcher(self.model, self.config)  # the search and the ranking with the views
        self._upper = isinstance(tokenizer, FairseqTokenizer)
        token_list = model.token_list if model.token_list is not None else tokenizer.token_list
        self._token_list = list(token_list)

    def _decode_config(self, config: SearchConfig | Mapping[str, Any] | PathLike | None) -> SearchConfig:
        if isinstance(config, (DecodeConfig, FairseqConfig)):
            return config
        if isinstance(config, (str, os.PathLike)):
            return load_decode_config(config)
        return self.model.search_config(None, **dict(config or {}))

    # --- loading ---------------------------------------------------------------------------------------

    @classmethod
    def from_pretrained(
        cls,
        source: PathLike,
        *,
        bpemodel: PathLike | None = None,
        device: str | torch.device = "cpu",
        decode_config: SearchConfig | Mapping[str, Any] | PathLike | None = None,
        average_nbest: int = 5,
        precision: str = "fp32",
        batch_frames: int = 3000,
        max_segment_s: float | None = None,
        edge_frames: Sequence[int | Sequence[int]] | str | None = "model",
    ) -> Transcriber:
        """A transcriber for an experiment directory or a checkpoint file.

        Args:
            source: an experiment directory (its ``average_nbest`` ``epoch<N>.pt`` with the best validation
                accuracy are averaged, as ESPnet's ``valid.acc.ave``; tokenizer: its ``bpe.model``), an avsr
                checkpoint (tokenizer: ``bpemodel`` or the ``bpe.model`` beside it), or an official fairseq
                AV-HuBERT fine-tuned checkpoint, seq2seq or CTC (tokenizer: ``bpemodel``, its sentencepiece
                model, else the one pickled in the checkpoint).
            bpemodel: the sentencepiece model (see ``source``).
            device, decode_config, precision, batch_frames, max_segment_s: as the class.
            average_nbest: checkpoints averaged from an experiment directory.
            edge_frames: as the class, or ``"model"``: the first to third quartile of the silent edges of the
                model's training audio, from the checkpoint's ``data_stats`` when the trainer recorded them
                (avsr models trained since 2026-11-26), else None (official checkpoints: inputs as given).

        The longest training utterance (``train_max_s`` of the class) and whether the model heard narrowband
        audio (``narrowband_trained``) come from the checkpoint's ``data_stats`` when the trainer recorded
        them.

        Raises:
            FileNotFoundError: no such directory/file, no checkpoint in the directory, no tokenizer.
            avsr.compat.CheckpointError: an unreadable or foreign checkpoint, weights that do not fit.
        """
        source = Path(source)
        stats: dict[str, Any] = {}
        if source.is_dir():
            paths = best_checkpoints(source, average_nbest)
            logger.info("model: average of %s", ", ".join(p.name for p in paths))
            first = load_checkpoint(paths[0])
            stats = first.get("data_stats") or {}
            model = AVSRModel.from_config(first["model_config"], str(paths[0]))
            model.load_state_dict(average_state_dicts(paths) if len(paths) > 1 else first["model"])
            tokenizer = Tokenizer(bpemodel if bpemodel is not None else source / "bpe.model")
        elif source.is_file():
            loaded = read_checkpoint(source)
            stats = loaded.data_stats
            logger.info("model: %s (%s)", source, loaded.kind)
            if bpemodel is None and loaded.kind == "avsr" and (source.parent / "bpe.model").is_file():
                bpemodel = source.parent / "bpe.model"
            model = AVSRModel.from_checkpoint(loaded, bpemodel=bpemodel)
            tokenizer = tokenizer_for(model, loaded, bpemodel)
        else:
            raise FileNotFoundError(f"no such experiment directory or checkpoint: {source}")
        train_max_s = stats["max_frames"] / FPS if stats.get("max_frames") else None
        if isinstance(edge_frames, str):
            if edge_frames != "model":
                raise ValueError(f"edge_frames must be 'model', None or (start, end), got {edge_frames!r}")
            edge_frames = _stats_edges(stats)
            if edge_frames is not None:
                logger.info("inputs get the silent edges of the training audio: %d-%d frames (40 ms) before "
                            "the speech, %d-%d after", *edge_frames[0], *edge_frames[1])
        return cls(model, tokenizer, decode_config, device, precision, batch_frames, max_segment_s,
                   train_max_s, edge_frames, narrowband_trained=bool(stats.get("narrowband_prob")))

    # --- one utterance ---------------------------------------------------------------------------------

    def __call__(
        self,
        video: PathLike | np.ndarray | torch.Tensor | None = None,
        audio: PathLike | np.ndarray | torch.Tensor | None = None,
        *,
        modality: str | None = None,
        noise: PathLike | torch.Tensor | NoiseSource | None = None,
        snr_db: float | None = None,
        key: str | None = None,
        sample_rate: int = SAMPLE_RATE,
        word_timings: bool = True,
    ) -> Transcript:
        """Transcribe one utterance.

        Args:
            video, audio: the inputs (module docstring); at least one.
            modality: ``audio``, ``video`` or ``audiovisual``; default: what was given.
            noise, snr_db: noise (a 16 kHz wav path, a ``(N,)`` waveform or a :class:`NoiseSource`) mixed
                into the audio at ``snr_db`` dB; the segment is chosen by ``key``.
            key: the utterance's name (default: from the path).
            sample_rate: rate of an ``audio`` array in Hz.
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

    # --- many utterances -------------------------------------------------------------------------------

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
        video_cache: MutableMapping[str, torch.Tensor] | None = None,
        work_dir: PathLike | None = None,
        window: int = 512,
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
                (``(D, T)`` float, on the CPU) under its key; when the same videos are decoded again (another
                noise condition of the audio), the video is neither read nor run through the front-end. Keys
                must be unique and the mapping used with one model and one set of videos.
            work_dir: where raw face videos' ROI mp4 and wav are written (kept); default: a temporary folder.
            window: items read ahead for bucketing when lengths are not known in advance.

        Returns:
            One :class:`Transcript` per item, in the order of ``items``; a bad item has ``error`` set (and is
            logged) unless ``strict``.

        Raises:
            InferenceError: with ``strict``, every bad item named; an unknown modality; ``noise`` without
                ``snr_db`` or the other way round; duplicate keys with ``video_cache``.
        """
        if modality is not None and modality not in MODALITY_INPUTS:
            raise InferenceError(f"modality must be one of {list(MODALITY_INPUTS)}, got {modality!r}")
        if (noise is None) != (snr_db is None):
            raise InferenceError("noise and snr_db go together: give both or neither")
        source = self._noise_source(noise)
        requests = [self._item(x, i) for i, x in enumerate(items)]
        if video_cache is not None and len({r.key for r in requests}) != len(requests):
            raise InferenceError("video_cache needs unique item keys")
        results: list[Transcript | None] = [None] * len(requests)
        show = progress if progress is not None else len(requests) > 10
        bar = tqdm(total=len(requests), desc="transcribe", disable=not show, dynamic_ncols=True,
                   mininterval=2.0)
        with contextlib.ExitStack() as stack:
            root = Path(work_dir) if work_dir is not None else Path(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="avsr_transcribe_")))
            groups: dict[str, list[int]] = {}
            for i, req in enumerate(requests):
                mod = modality or self._given_modality(req)
                if isinstance(mod, Transcript):
                    results[i] = mod
                    bar.update()
                    continue
                groups.setdefault(mod, []).append(i)
            for mod, indices in groups.items():
                known = all(requests[i].num_frames is not None for i in indices)
                step = len(indices) if known else max(1, window)
                for start in range(0, len(indices), step):
                    chunk = indices[start : start + step]
                    self._run_chunk(requests, chunk, mod, source, snr_db, results, word_timings,
                                    video_cache, root, bar)
        bar.close()
        out = [r for r in results if r is not None]
        self._warn_low_rate(out)
        kept = [r.key for r in out if r.info.get("edges_note", "").startswith("no audio")]
        if kept:
            logger.warning("%d video-only input(s) without audio (the first: %s) keep their silent edges: "
                           "give the audio too (modality='video') to decode them as the recipe's decoding "
                           "stage does", len(kept), kept[0])
        failed = [r for r in out if not r.ok]
        for r in failed:
            logger.warning("%s: %s", r.key, r.error)
        if failed:
            logger.warning("%d of %d items could not be transcribed", len(failed), len(out))
            if strict:
                raise InferenceError("; ".join(r.error for r in failed))
        return out

    # --- internals -------------------------------------------------------------------------------------

    def _warn_low_rate(self, results: list[Transcript]) -> None:
        """``narrowband_trained`` False: a warning on each transcript whose audio was recorded below 16 kHz,
        and one log line for them all."""
        if self.narrowband_trained:
            return
        low = [r for r in results if r.ok and r.info.get("resampled_from_hz", SAMPLE_RATE) < SAMPLE_RATE]
        for r in low:
            rate = r.info["resampled_from_hz"]
            note = (f"recorded at {rate} Hz: no frequencies above {rate // 2} Hz; a model trained on "
                    "full-band audio misreads such audio, and this one was trained without narrowband_prob: "
                    "expect a higher WER")
            r.info["warning"] = f"{r.info['warning']}; {note}" if r.info.get("warning") else note
        if low:
            lowest = min(low, key=lambda r: r.info["resampled_from_hz"])
            logger.warning("%d of %d inputs were recorded below 16 kHz (the lowest: %s at %d Hz) and have no "
                           "frequencies above half their rate; models trained on full-band audio misread "
                           "them, and this one was trained without narrowband_prob", len(low), len(results),
                           lowest.key, lowest.info["resampled_from_hz"])

    @staticmethod
    def _noise_source(noise: Any) -> NoiseSource | None:
        if noise is None or isinstance(noise, NoiseSource):
            return noise
        if isinstance(noise, (str, os.PathLike)):
            try:
                return NoiseSource(noise)
            except (MediaError, ValueError) as exc:
                raise InferenceError(f"noise {noise}: {exc}") from exc
        try:
            return NoiseSource.from_waveform(_to_tensor(noise, "noise", "noise"))
        except ValueError as exc:
            raise InferenceError(str(exc)) from exc

    @staticmethod
    def _item(x: Any, index: int) -> TranscribeItem:
        if isinstance(x, TranscribeItem):
            item = TranscribeItem(x.video, x.audio, x.key, x.num_frames, x.sample_rate)
        elif isinstance(x, Utterance):
            item = TranscribeItem(x.video, x.wav, x.utt_id, x.num_frames)
        elif isinstance(x, Mapping):
            unknown = set(x) - {"video", "audio", "key", "num_frames", "sample_rate"}
            if unknown:
                raise InferenceError(f"item {index}: unknown field(s) {sorted(unknown)}")
            item = TranscribeItem(**x)
        elif isinstance(x, (str, os.PathLike)):
            return _MediaFileItem(video=x, audio=x, key=Path(x).stem)
        else:
            raise InferenceError(f"item {index}: expected a TranscribeItem, an Utterance, a mapping or a "
                                 f"path, got {type(x).__name__}")
        if item.key is None:
            path = next((s for s in (item.video, item.audio) if isinstance(s, (str, os.PathLike))), None)
            item.key = Path(path).stem if path is not None else f"utt{index}"
        return item

    @staticmethod
    def _given_modality(item: TranscribeItem) -> str | Transcript:
        """The modality of what an item has (a path item: its streams), or a Transcript with the error."""
        has_video, has_audio = item.video is not None, item.audio is not None
        if isinstance(item, _MediaFileItem):
            try:
                has_audio, size = _streams(Path(item.video))
            except InferenceError as exc:
                return Transcript(key=item.key, error=str(exc))
            has_video = size is not None
        if has_video and has_audio:
            return "audiovisual"
        if has_video or has_audio:
            return "video" if has_video else "audio"
        return Transcript(key=item.key, error=f"{item.key}: neither video nor audio given")

    def _run_chunk(self, requests, chunk, modality, source, snr_db, results, want_words, video_cache, root,
                   bar) -> None:
        """Read, cut, bucket and decode the items ``chunk`` (indices into ``requests``) under one modality.

        Items whose length is known and needs no cutting are read batch by batch; the others are read first
        (long ones cut into segments by :meth:`_segments`). Every piece is a unit of the length buckets.
        """
        inputs = MODALITY_INPUTS[modality]
        limit = int(self.max_segment_s * FPS) if self.max_segment_s is not None else None

        def load(i: int, whole: bool = False) -> _Media | None:
            req = requests[i]
            try:
                work = root / f"{i:05d}_{req.key}"
                media = self._load(req, inputs, work, video_cache, source, snr_db)
                return self._shifted(media) if whole else media
            except (InferenceError, MediaError, ValueError) as exc:
                message = str(exc) if req.key in str(exc) else f"{req.key}: {exc}"
                results[i] = Transcript(key=req.key, modality=modality, error=message)
                bar.update()
                return None

        units: list[tuple[int, int, _Media | None]] = []  # (item, length, media or None: read later)
        pieces: dict[int, int] = {}
        for i in chunk:
            hint = requests[i].num_frames
            if hint is not None and (limit is None or hint <= limit):
                units.append((i, int(hint), None))
                pieces[i] = 1
                continue
            m = load(i)
            if m is None:
                continue
            try:
                segments = self._segments(m, limit)
            except InferenceError as exc:
                results[i] = Transcript(key=m.key, modality=modality, error=str(exc))
                bar.update()
                continue
            units += [(i, seg.num_frames, seg) for seg in segments]
            pieces[i] = len(segments)
        parts: dict[int, list[tuple[int, Transcript]]] = {}
        for batch in length_buckets([n for _, n, _ in units], self.batch_frames, oversize="alone"):
            todo = [(units[j][0], units[j][2] or load(units[j][0], whole=True)) for j in batch]
            todo = [(i, m) for i, m in todo if m is not None]
            if not todo:
                continue
            transcripts = self._decode([m for _, m in todo], modality, want_words, video_cache)
            for (i, m), transcript in zip(todo, transcripts):
                parts.setdefault(i, []).append((m.offset, transcript))
                if len(parts[i]) == pieces[i]:
                    results[i] = self._join(requests[i].key, parts.pop(i))
                    bar.update()

    def _segments(self, media: _Media, limit: int | None) -> list[_Media]:
        """``media`` (as read) whole, its edges changed (:meth:`_shifted`), or, longer than ``limit`` frames,
        cut at pauses (:func:`pause_cuts`) into pieces of at most ``limit`` frames, each given the edges of
        ``edge_frames`` of its own (pieces with audio)."""
        if limit is None or media.num_frames + sum(media.change or (0, 0)) <= limit:
            whole = self._shifted(media)
            if self.train_max_s is not None and whole.num_frames > self.train_max_s * FPS:
                whole.info["warning"] = (
                    f"{whole.num_frames / FPS:.1f} s is longer than the longest training utterance "
                    f"({self.train_max_s:.1f} s): the transcript may degrade; cut it (max_segment_s)")
                logger.warning("%s: %s", whole.key, whole.info["warning"])
            return [whole]
        activity = frame_energy_db(media.wav) if media.wav is not None else frame_motion(media.frames)
        bounds = [0, *pause_cuts(activity[: media.num_frames], limit), media.num_frames]
        info = {k: v for k, v in media.info.items() if k not in ("edges_changed_frames", "edges_note")}
        out = []
        for n, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:])):
            samples = slice(start * SAMPLES_PER_FRAME, stop * SAMPLES_PER_FRAME)
            wav = media.wav[samples] if media.wav is not None else None
            frames = media.frames[start:stop] if media.frames is not None else None
            change = edge_shift(wav, self.edge_frames) if self.edge_frames and wav is not None else None
            if change is not None and (change == (0, 0) or stop - start + sum(change) < MIN_FRAMES):
                change = None
            piece = _Media(f"{media.key}#{n}", wav, frames, stop - start, dict(info), offset=start,
                           cache_key=f"{media.key}#{n}", change=change)
            if change is not None:
                piece.info["edges_changed_frames"] = list(change)
            out.append(self._shifted(piece))
        return out

    def _shifted(self, media: _Media) -> _Media:
        """``media`` with the change of its edges (``media.change``) made: audio and video together, the added
        audio the recording's own silence (:func:`avsr.features.own_silence`). Raises InferenceError when
        too little is left."""
        change = media.change
        if change is None:
            return media
        wav, frames = media.wav, media.frames
        silence = own_silence(wav) if wav is not None else None
        wav, frames = shift_edges(wav, frames, change[0], change[1], silence=silence)
        num_frames = media.num_frames + change[0] + change[1]
        if num_frames < MIN_FRAMES:
            raise InferenceError(f"{media.key}: {num_frames} frame(s) are left once the silence at its ends "
                                 f"is cut to {self.edge_frames}; at least {MIN_FRAMES} are needed")
        return dataclasses.replace(media, wav=wav, frames=frames, num_frames=num_frames)

    @staticmethod
    def _join(key: str, parts: list[tuple[int, Transcript]]) -> Transcript:
        """One transcript from the ``(offset in frames, transcript)`` of an item's segments: text and tokens
        in time order, scores summed, word times moved by the offsets (one part: the part itself)."""
        if len(parts) == 1:
            parts[0][1].key = key
            return parts[0][1]
        parts = sorted(parts, key=lambda p: p[0])
        words = None
        if all(t.words is not None for _, t in parts):
            words = []
            for off, t in parts:
                shift = off / FPS
                words += [dataclasses.replace(w, start=round(w.start + shift, 3), end=round(w.end + shift, 3))
                          for w in t.words]
        first = parts[0][1]
        info = {**first.info, "segments_s": [[off / FPS, (off + t.num_frames) / FPS] for off, t in parts]}
        info.pop("edges_changed_frames", None)
        if any("edges_changed_frames" in t.info for _, t in parts):
            info["segments_edges_changed_frames"] = [t.info.get("edges_changed_frames") for _, t in parts]
        return Transcript(key=key, text=" ".join(t.text for _, t in parts if t.text),
                          tokens=[x for _, t in parts for x in t.tokens],
                          score=sum(t.score for _, t in parts), words=words, modality=first.modality,
                          num_frames=sum(t.num_frames for _, t in parts), info=info)

    @staticmethod
    def _restore_edges(t: Transcript, change: tuple[int, int] | None) -> Transcript:
        """``t`` (of a unit whose edges were changed by ``change``) on the time line of the unit as read:
        its length and word times without the change."""
        if change is None:
            return t
        t.num_frames -= change[0] + change[1]
        shift, last = change[0] / FPS, t.num_frames / FPS
        if t.words is not None:
            t.words = [dataclasses.replace(w, start=round(min(max(w.start - shift, 0.0), last), 3),
                                           end=round(min(max(w.end - shift, 0.0), last), 3)) for w in t.words]
        return t

    def _load(self, item: TranscribeItem, inputs: tuple[str, ...], work: Path,
              video_cache: Mapping[str, torch.Tensor] | None, source: NoiseSource | None,
              snr_db: float | None) -> _Media:
        """The raw media of one item for ``inputs`` (see the module docstring), the noise mixed into the audio
        with the segment chosen by the item's key (as the recipe's test conditions), and the change of its
        edges that gives it ``edge_frames`` silent frames (``change``, made by :meth:`_shifted`). The video
        is not read when ``video_cache`` holds it (with the same change of the edges). Raises
        InferenceError."""
        key, info = item.key, {}
        need_audio, need_video = "audio" in inputs, "video" in inputs
        for stream, needed, other in (("video", need_video, "audio"), ("audio", need_audio, "video")):
            if needed and getattr(item, stream) is None:
                raise InferenceError(f"{key}: no {stream} given, but the modality needs it (try the {other} "
                                     f"modality)")
        frames = wav = None
        num_frames: int | None = None
        same_file = (need_audio and need_video and isinstance(item.video, (str, os.PathLike))
                     and isinstance(item.audio, (str, os.PathLike))
                     and Path(item.video).resolve() == Path(item.audio).resolve())
        if need_video and same_file and video_cache is None:  # the ROI stage gives the file's audio too
            frames, wav, video_info = self._load_video(item, work, with_audio=True)
            info.update(video_info)
            num_frames = int(frames.shape[0])
        if need_audio and wav is None:
            wav, audio_info = self._load_audio(item)
            info.update(audio_info)
        if wav is not None and source is not None:
            wav = source.mix(wav, snr_db, key=key)
            info.update(noise=source.path, snr_db=snr_db)
        change = self._edge_change(item, wav, source, snr_db, info)
        cache_key = key if change is None else f"{key}@{change[0]},{change[1]}"
        if need_video and frames is None:
            if video_cache is not None and cache_key in video_cache:
                num_frames = int(video_cache[cache_key].shape[-1]) - (sum(change) if change else 0)
            else:
                frames, _, video_info = self._load_video(item, work, with_audio=False)
                info.update(video_info)
                num_frames = int(frames.shape[0])
        if wav is not None and need_audio:
            audio_frames = wav.numel() / SAMPLES_PER_FRAME
            if num_frames is not None and abs(audio_frames - num_frames) > MAX_FRAME_DIFF and not same_file:
                raise InferenceError(
                    f"{key}: the audio {_name(item.audio)} lasts {wav.numel() / SAMPLE_RATE:.3f} s "
                    f"({audio_frames:.1f} frames) but the video {_name(item.video)} has {num_frames} frames "
                    f"at 25 fps ({num_frames / FPS:.3f} s); they must agree within {MAX_FRAME_DIFF} frames")
            if num_frames is None:
                num_frames = math.ceil(wav.numel() / SAMPLES_PER_FRAME)
        if num_frames < MIN_FRAMES:
            raise InferenceError(f"{key}: the input is {num_frames} frame(s) long ({num_frames / FPS:.2f} "
                                 f"s); at least {MIN_FRAMES} frames at 25 fps are needed")
        if not need_audio:
            wav = None
        return _Media(key, wav, frames, num_frames, info, cache_key=cache_key, change=change)

    def _edge_change(self, item: TranscribeItem, wav: torch.Tensor | None, source: NoiseSource | None,
                     snr_db: float | None, info: dict[str, Any]) -> tuple[int, int] | None:
        """The change of the edges (:func:`avsr.features.edge_shift`) that gives the item ``edge_frames``,
        found in ``wav`` (the audio as decoded, noise mixed in) or, for a video-only decode, in the item's
        audio read here with the same noise (the recording a user would have); None when nothing changes
        (``info["edges_note"]`` says why when the edges were not found). Records the change as
        ``info["edges_changed_frames"]``."""
        if self.edge_frames is None:
            return None
        if wav is None:
            if item.audio is None:
                info["edges_note"] = "no audio to find the speech's edges in: edges kept"
                return None
            try:
                wav, _ = self._load_audio(item)
            except (InferenceError, MediaError, ValueError) as exc:
                info["edges_note"] = f"edges kept: its audio could not be read ({exc})"
                return None
            if source is not None:
                wav = source.mix(wav, snr_db, key=item.key)
        change = edge_shift(wav, self.edge_frames)
        if change is None:
            info["edges_note"] = ("no silence in the audio (its quietest frame is less than 40 dB below its "
                                  "loudest: noise throughout?): edges kept")
            return None
        if change == (0, 0):
            return None
        info["edges_changed_frames"] = list(change)
        return change

    def _load_video(self, item: TranscribeItem, work: Path, with_audio: bool
                    ) -> tuple[torch.Tensor, torch.Tensor | None, dict[str, Any]]:
        """ROI frames (T, H, W) uint8 (and the wav of the same raw file when ``with_audio``)."""
        key, source = item.key, item.video
        if not isinstance(source, (str, os.PathLike)):
            frames = _to_tensor(source, "video", key)
            if frames.dtype != torch.uint8:
                raise InferenceError(f"{key}: video frames must be uint8 (0-255), got {frames.dtype}")
            if frames.dim() == 4 and frames.shape[-1] == 3:
                from avsr.data.roi import RoiError, extract_mouth_roi

                try:
                    track = extract_mouth_roi(frames, name=key)
                except RoiError as exc:
                    raise InferenceError(self._no_face(str(exc), key, item.audio is not None)) from exc
                return torch.from_numpy(track.frames), None, {"frames_without_face": track.num_missing}
            if frames.dim() != 3 or min(frames.shape[1:]) < 88:
                raise InferenceError(
                    f"{key}: video frames must be ROI frames (T, H, W) with H, W >= 88 (AV-HuBERT: 96x96) or "
                    f"RGB face frames (T, H, W, 3), got shape {tuple(frames.shape)}")
            if frames.shape[0] == 0:
                raise InferenceError(f"{key}: the video has no frame")
            return frames, None, {}
        path = Path(source)
        has_audio, size = _streams(path)
        if size is None:
            raise InferenceError(f"{path}: no video track, but the modality needs one (try --modality audio)")
        if with_audio and not has_audio:
            raise InferenceError(f"{path}: no audio track, but the modality needs one (try --modality video)")
        if size == (ROI_SIZE, ROI_SIZE):  # a preprocessed mouth ROI
            if abs(video_fps(path) - FPS) < 0.01:
                frames = read_video(path)
            else:  # resampled to 25 fps by timestamp, gray as BT.601 luma
                rgb = read_video_rgb(path, FPS)[0].to(torch.float32)
                frames = (rgb @ torch.tensor([0.299, 0.587, 0.114])).round().clamp(0, 255).to(torch.uint8)
            return frames, None, {}
        from avsr.data.roi import RoiError, preprocess_video

        work.mkdir(parents=True, exist_ok=True)
        mp4, wav_path = work / "roi.mp4", (work / "audio.wav" if with_audio else None)
        try:
            stats = preprocess_video(path, mp4, wav_path)
        except RoiError as exc:
            raise InferenceError(self._no_face(str(exc), str(path), has_audio)) from exc
        info = {"frames_without_face": stats.get("frames_without_face")}
        if stats.get("audio_padded_s"):
            info["audio_padded_s"] = stats["audio_padded_s"]
        return read_video(mp4), (read_wav(wav_path) if wav_path is not None else None), info

    @staticmethod
    def _no_face(message: str, name: str, audio_available: bool) -> str:
        text = message if name in message else f"{name}: {message}"
        if "no face" in message and audio_available:
            text += " (its audio alone can be transcribed with the audio modality: --modality audio)"
        return text

    def _load_audio(self, item: TranscribeItem) -> tuple[torch.Tensor, dict[str, Any]]:
        """The 16 kHz waveform (N,) float32 of an item's audio input."""
        key, source = item.key, item.audio
        if not isinstance(source, (str, os.PathLike)):
            wav = _check_waveform(_to_tensor(source, "audio", key), key, "array")
            if not 4000 <= item.sample_rate <= 384000:
                raise InferenceError(f"{key}: sample_rate {item.sample_rate} Hz cannot be right for speech")
            info: dict[str, Any] = {}
            if item.sample_rate != SAMPLE_RATE:
                import torchaudio

                wav = torchaudio.functional.resample(wav, item.sample_rate, SAMPLE_RATE)
                info["resampled_from_hz"] = item.sample_rate
            return wav, info
        path = Path(source)
        has_audio, size = _streams(path)
        if not has_audio:
            raise InferenceError(f"{path}: no audio track, but the modality needs one (try --modality video)")
        if size is not None:  # the audio of a video file: as the ROI stage writes it
            wav = read_audio_track(path, SAMPLE_RATE)
            num_frames = int(read_video_rgb(path, FPS)[0].shape[0])
            aligned = torch.zeros(num_frames * SAMPLES_PER_FRAME)
            n = min(aligned.numel(), wav.numel())
            aligned[:n] = wav[:n]
            return pcm16_round_trip(_check_waveform(aligned, key, str(path))), {}
        wav, info = _read_audio_file(path, key)
        return _check_waveform(wav, key, str(path)), info

    @torch.no_grad()
    def _decode(self, units: list[_Media], modality: str, want_words: bool, video_cache) -> list[Transcript]:
        """Features, one batched search, texts and word timings for the loaded pieces ``units``."""
        inputs = MODALITY_INPUTS[modality]
        keys = [m.cache_key for m in units]
        lengths = torch.tensor([m.num_frames for m in units], dtype=torch.long)
        audio = video = video_features = None
        if "audio" in inputs:  # as the recipe's AVDataset: AV-HuBERT's features at 25 Hz
            feats = [avhubert_audio_features(m.wav, num_video_frames=m.num_frames) for m in units]
            audio = pad_sequence(feats, batch_first=True).transpose(1, 2).to(self.device)  # (B, 104, T)
        read = [j for j, m in enumerate(units) if m.frames is not None]  # the others' video is cached
        if "video" in inputs and read:
            frames = [normalize_video(crop_video(units[j].frames, train=False)) for j in read]
            video = pad_sequence(frames, batch_first=True).unsqueeze(1).to(self.device)  # (b, 1, T, 88, 88)
        lengths = lengths.to(self.device)
        with self._autocast():
            if "video" in inputs and video_cache is not None:
                if video is not None:
                    video_features = self.model.encoder.encode_video(video, lengths[read])
                    for jj, j in enumerate(read):
                        video_cache[keys[j]] = video_features[jj, :, : int(lengths[j])].float().cpu()
                if len(read) < len(units):  # some (or all) videos of the batch were cached
                    cached = [video_cache[k].transpose(0, 1) for k in keys]  # (T, D) each
                    video_features = pad_sequence(cached, batch_first=True).transpose(1, 2).to(self.device)
            hyps, ctc_logp, enc_lens = self.searcher.decode(
                audio, None if video_features is not None else video, lengths, video_features)
        out = []
        for j, m in enumerate(units):
            best = hyps[j][0] if hyps[j] else None
            tokens = list(best.tokens) if best is not None else []
            info = dict(m.info)
            words = None
            if want_words:
                if ctc_logp is None:
                    info["words_note"] = "the model has no CTC head: no word timings"
                else:
                    try:
                        frame_logp = ctc_logp[j, : int(enc_lens[j])].float()
                        words = word_timings(frame_logp, tokens, self._token_list, blank=self.model.blank,
                                             decode=self._text)
                    except AlignmentError as exc:
                        info["words_note"] = f"no word timings: {exc}"
            out.append(self._restore_edges(Transcript(
                key=m.key, text=self._text(tokens), tokens=tokens,
                score=float(best.score) if best is not None else math.nan, words=words, modality=modality,
                num_frames=m.num_frames, info=info), m.change))
        return out

    def _text(self, tokens: Iterable[int]) -> str:
        text = self.tokenizer.decode(list(tokens))
        return text.upper() if self._upper else text

    def _autocast(self):
        return autocast_context(self.device, self.precision)


class _MediaFileItem(TranscribeItem):
    """A bare path given as an item: its video stream and its audio stream, whichever it has."""
