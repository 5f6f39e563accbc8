"""The shared types of inference: the items to transcribe, their transcripts, the error, a piece's media.

Every other module of :mod:`avsr.inference` imports these; this module imports none of them.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from avsr.decode.align import WordTiming
from avsr.inference.video_cache import VersionKey, version_key

__all__ = ["FPS", "SAMPLE_RATE", "ROI_SIZE", "MIN_FRAMES", "MAX_FRAME_DIFF", "MAX_EDGE_FRAMES", "PathLike",
           "InferenceError", "TranscribeItem", "MediaFileItem", "Transcript", "Media"]

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
#: most silent frames (40 ms) :class:`avsr.inference.Transcriber`'s ``edge_frames`` may ask for at each end
#: (2 s).
MAX_EDGE_FRAMES = 50

PathLike = str | os.PathLike


class InferenceError(ValueError):
    """An input or an argument cannot be used for transcription; the message names the input (file or item
    key) or the argument (``modality=``, ``noise=``, ...) and the reason, in the terms of the Python API
    (command-line tools translate them to their options)."""


@dataclass
class TranscribeItem:
    """One utterance to transcribe (see :mod:`avsr.inference` for what each input may be).

    Attributes:
        video: path or uint8 array/tensor ``(T, H, W)`` ROI / ``(T, H, W, 3)`` RGB frames at 25 fps, or None.
        audio: path or float waveform ``(N,)`` (at ``sample_rate``), or None.
        key: the utterance's name in results, errors, noise-segment choice and the video cache (default: the
            stem of the video path, else of the audio path, else ``utt<index>``).
        num_frames: its length in 25 fps frames if known (e.g. ``utt2num_frames``): batches are then formed
            before any file is read.
        sample_rate: rate of an ``audio`` array in Hz (resampled to 16 kHz); None: 16 kHz assumed, and an
            array that looks band-limited to 4 kHz gets a warning
            (:func:`avsr.inference.inputs.warn_narrowband`).
    """

    video: PathLike | np.ndarray | torch.Tensor | None = None
    audio: PathLike | np.ndarray | torch.Tensor | None = None
    key: str | None = None
    num_frames: int | None = None
    sample_rate: int | None = None


class MediaFileItem(TranscribeItem):
    """A bare path given as an item: its video stream and its audio stream, whichever it has."""


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
        info: facts about the input (``frames_without_face``, ``audio_padded_s``, ``audio_cut_s``,
            ``audio_offset_s``, ``video_timestamps_ignored`` with ``video_assumed_fps``,
            ``video_resampled_from_fps``, ``video_rotated_deg``; ``video_fallback``: why an audio-visual
            item's video was not used, it was then decoded audio-only, ``modality`` ``"audio"``;
            ``resampled_from_hz``, ``narrowband_db``, ``noise``, ``snr_db``, ``words_note``,
            ``edges_changed_frames``, ``edges_note``), what fusion did with audio-visual input whose views
            were ranked (``audio_gate``: the mean audio gate, near 0 where the model fell back to the lips;
            ``video_trust``: the video trust gate, near 0 for lips the model takes for someone else's or a
            frozen mouth, and 0 or 1 where the search decides;
            :meth:`avsr.encoder.AVHubertEncoder.gate_means`; with that decision ``video_sync``, the lips'
            sync margin, ``audio_ctc_confidence``, the audio view's confidence it was weighed against, and
            ``video_ctc_entropy``, the video-only view's mean CTC entropy per frame (nats):
            ``video_sync_margin`` and ``video_max_entropy`` of :class:`avsr.decode.DecodeConfig`) and
            ``warning`` (an input longer than the model's training utterances, audio recorded below 16 kHz,
            an audio array without ``sample_rate`` that looks like 8 kHz audio).
        error: why the item could not be transcribed, or None.
        views: audio-visual input decoded with ``views=True``
            (:meth:`avsr.inference.Transcriber.transcribe_batch`): the transcripts of the single-stream views
            that the search ranked the hypotheses with, under ``"video"`` and ``"audio"`` (each view's own
            best hypothesis: what decoding that stream alone gives; no word timings), else None.
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
    views: dict[str, Transcript] | None = None

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
        if self.views is not None:
            out["views"] = {name: {"text": v.text, "tokens": list(v.tokens), "score": v.score}
                            for name, v in self.views.items()}
        return out


@dataclass
class Media:
    """Raw media of one item or one segment of it, ready to decode.

    Attributes:
        key: the item's key (a segment: ``<key>#<n>``).
        wav: ``(N,)`` float32 16 kHz waveform (noise already mixed in), or None.
        frames: ``(T, H, W)`` uint8 ROI frames at 25 fps, or None (not needed, or cached).
        num_frames: the length in 25 fps frames.
        info: facts for :attr:`Transcript.info`.
        offset: its first frame in the item (25 fps).
        video_id: which frames it holds as read (default: the item's key; a segment: ``(key, start, stop)``,
            its bounds in frames, so that segments cut at other bounds never share a video cache entry and no
            segment shares one with an item, whatever the keys' characters).
        change: the change of its edges (:func:`avsr.features.edge_shift`, frames added (+) or removed (-)
            at the start and at the end) still to make (as loaded) or made (a unit to decode), or None.
    """

    key: str
    wav: torch.Tensor | None
    frames: torch.Tensor | None
    num_frames: int
    info: dict[str, Any]
    offset: int = 0
    video_id: str | tuple[str, int, int] = ""
    change: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        self.video_id = self.video_id or self.key

    @property
    def cache_key(self) -> VersionKey:
        """Its entry in the video cache: the frames it holds with the change of its edges
        (:func:`avsr.inference.video_cache.version_key`)."""
        return version_key(self.video_id, self.change)
