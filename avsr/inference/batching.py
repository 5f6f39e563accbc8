"""One transcription call's items, from reading to length-bucketed batches and back to one transcript each.

:class:`avsr.inference.Transcriber` decodes; this module does the rest of a
:meth:`~avsr.inference.Transcriber.transcribe_batch` call: it groups the items by the modality they are
decoded in, reads them (:func:`avsr.inference.inputs.load_item`; an item whose length is known and needs no
cutting is read only when its batch comes), cuts long ones at pauses
(:func:`avsr.inference.segments.segments`), buckets the pieces by length
(:func:`avsr.data.dataset.length_buckets`), computes the recipe's model inputs (:func:`model_inputs`), joins
an item's pieces again (:func:`avsr.inference.segments.join`) and reports the call's warnings
(:func:`report`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch.nn.utils.rnn import pad_sequence

from avsr.data.dataset import length_buckets
from avsr.data.media import MediaError
from avsr.data.noise import NoiseSource
from avsr.features import avhubert_audio_features, crop_video, normalize_video
from avsr.inference.inputs import given_modality, load_item, warn_low_rate, warn_narrowband
from avsr.inference.segments import EdgeRanges, join, segments, shifted
from avsr.inference.types import FPS, InferenceError, Media, TranscribeItem, Transcript
from avsr.inference.video_cache import VersionKey, video_features
from avsr.modalities import MODALITY_INPUTS

__all__ = ["Call", "ModelInputs", "cached_video_features", "model_inputs", "report"]

logger = logging.getLogger("avsr.inference")


@dataclass
class Call:
    """The state of one :meth:`avsr.inference.Transcriber.transcribe_batch` call.

    Attributes:
        items: the call's items.
        source, snr_db: the noise mixed into the audio (None: none).
        video_cache: the caller's video cache, or None.
        root: the folder where raw face videos' ROI mp4 and wav are written.
        edge_frames: the transcriber's ``edge_frames`` (None: inputs as given).
        bar: the progress bar (one step per finished item).
        results: one transcript per item once finished (by index), else None.
    """

    items: list[TranscribeItem]
    source: NoiseSource | None
    snr_db: float | None
    video_cache: MutableMapping[VersionKey, torch.Tensor] | None
    root: Path
    edge_frames: EdgeRanges | None
    bar: Any
    results: list[Transcript | None] = field(init=False)
    _pieces: dict[int, int] = field(init=False, default_factory=dict)
    _parts: dict[int, list[tuple[int, Transcript]]] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.results = [None] * len(self.items)

    def done(self, i: int, transcript: Transcript) -> None:
        """Item ``i`` is finished with ``transcript``."""
        self.results[i] = transcript
        self.bar.update()

    def groups(self, modality: str | None) -> dict[str, list[int]]:
        """The items' indices by the modality they are decoded in (``modality``, or None: what each item
        has); an item without any is finished with its error."""
        groups: dict[str, list[int]] = {}
        for i, item in enumerate(self.items):
            mod = modality or given_modality(item)
            if isinstance(mod, Transcript):
                self.done(i, mod)
            else:
                groups.setdefault(mod, []).append(i)
        return groups

    def load(self, i: int, modality: str, whole: bool = False) -> Media | None:
        """Item ``i`` read for ``modality`` (``whole``: its edges changed too), or None, the item finished
        with its error."""
        item = self.items[i]
        try:
            media = load_item(item, MODALITY_INPUTS[modality], self.root / f"{i:05d}_{item.key}",
                              video_cache=self.video_cache, source=self.source, snr_db=self.snr_db,
                              edge_frames=self.edge_frames)
            return shifted(media, self.edge_frames) if whole else media
        except (InferenceError, MediaError, ValueError) as exc:
            message = str(exc) if item.key in str(exc) else f"{item.key}: {exc}"
            self.done(i, Transcript(key=item.key, modality=modality, error=message))
            return None

    def run(self, modality: str | None, window: int, max_segment_s: float | None, batch_frames: int,
            train_max_s: float | None, decode: Callable[[list[Media], str], list[Transcript]]
            ) -> list[Transcript]:
        """Every item through :meth:`batches` and ``decode`` (pieces and their modality -> one transcript
        each), ``window`` items read ahead at a time unless every item of a modality has ``num_frames``;
        returns the items' transcripts in order."""
        for mod, indices in self.groups(modality).items():
            known = all(self.items[i].num_frames is not None for i in indices)
            step = len(indices) if known else max(1, window)
            for start in range(0, len(indices), step):
                for pieces, piece_mod in self.batches(indices[start : start + step], mod, max_segment_s,
                                                      batch_frames, train_max_s):
                    for (i, m), transcript in zip(pieces, decode([m for _, m in pieces], piece_mod)):
                        self.add(i, m.offset, transcript)
        return [r for r in self.results if r is not None]

    def batches(self, chunk: list[int], modality: str, max_segment_s: float | None, batch_frames: int,
                train_max_s: float | None) -> Iterator[tuple[list[tuple[int, Media]], str]]:
        """The pieces of the items ``chunk`` in length buckets of at most ``batch_frames`` padded frames, each
        as ``(pieces, modality)``: ``(item index, piece)`` pairs and the modality to decode them in (an
        audio-visual item whose video cannot be used comes in a batch of its own, ``"audio"``). Items whose
        length is known and needs no cutting are read batch by batch; the others first, long ones cut at
        pauses into pieces of at most ``max_segment_s`` seconds (None: never cut). Pass each decoded piece to
        :meth:`add`.
        """
        limit = int(max_segment_s * FPS) if max_segment_s is not None else None
        units: list[tuple[int, int, Media | None]] = []  # (item, length, media or None: read later)
        for i in chunk:
            hint = self.items[i].num_frames
            if hint is not None and (limit is None or hint <= limit):
                units.append((i, int(hint), None))
                self._pieces[i] = 1
                continue
            m = self.load(i, modality)
            if m is None:
                continue
            try:
                cut = segments(m, limit, self.edge_frames, train_max_s)
            except InferenceError as exc:
                self.done(i, Transcript(key=m.key, modality=modality, error=str(exc)))
                continue
            units += [(i, piece.num_frames, piece) for piece in cut]
            self._pieces[i] = len(cut)
        for batch in length_buckets([n for _, n, _ in units], batch_frames, oversize="alone"):
            loaded = [(units[j][0], units[j][2] or self.load(units[j][0], modality, whole=True))
                      for j in batch]
            usable = [(i, m) for i, m in loaded if m is not None and "video_fallback" not in m.info]
            fallback = [(i, m) for i, m in loaded if m is not None and "video_fallback" in m.info]
            yield from ((group, mod) for group, mod in ((usable, modality), (fallback, "audio")) if group)

    def add(self, i: int, offset: int, transcript: Transcript) -> None:
        """A decoded piece of item ``i`` starting at frame ``offset``; the item is finished (its pieces
        joined) with its last piece."""
        parts = self._parts.setdefault(i, [])
        parts.append((offset, transcript))
        if len(parts) == self._pieces[i]:
            self.done(i, join(self.items[i].key, self._parts.pop(i)))


class ModelInputs(NamedTuple):
    """The model's inputs for a batch of pieces (:func:`model_inputs`)."""

    #: ``(B, 104, T)`` float32 AV-HuBERT audio features at 25 Hz, or None (not needed)
    audio: torch.Tensor | None
    #: ``(b, 1, T, 88, 88)`` float32 normalised centre crops of the pieces whose frames were read, or None
    video: torch.Tensor | None
    #: the indices of those pieces in the batch (the others' video is in the video cache)
    read: list[int]
    #: ``(B,)`` int64 valid frames of each piece
    lengths: torch.Tensor


def model_inputs(units: list[Media], inputs: tuple[str, ...], device: torch.device) -> ModelInputs:
    """The model's inputs for ``units``, as the recipe's AVDataset computes them (AV-HuBERT's stacked log
    filterbanks; the 88x88 centre crop normalised with mean 0.421 and std 0.165), on ``device``.

    Args:
        units: the pieces of one batch.  inputs: the streams the modality needs (``"audio"``, ``"video"``).
        device: where the model runs.
    """
    audio = video = None
    if "audio" in inputs:
        feats = [avhubert_audio_features(m.wav, num_video_frames=m.num_frames) for m in units]
        audio = pad_sequence(feats, batch_first=True).transpose(1, 2).to(device)
    read = [j for j, m in enumerate(units) if m.frames is not None]
    if "video" in inputs and read:
        frames = [normalize_video(crop_video(units[j].frames, train=False)) for j in read]
        video = pad_sequence(frames, batch_first=True).unsqueeze(1).to(device)
    lengths = torch.tensor([m.num_frames for m in units], dtype=torch.long).to(device)
    return ModelInputs(audio, video, read, lengths)


def cached_video_features(encode_video: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                          radius: int | None, units: list[Media], batch: ModelInputs,
                          cache: MutableMapping[VersionKey, torch.Tensor]) -> torch.Tensor:
    """The video front-end's output ``(B, D, T)`` for a batch whose videos are kept in the caller's video
    cache: the videos read run through the front-end or are made from another version of their edges
    (:func:`avsr.inference.video_cache.video_features`, which stores them), the others come from the cache.

    Args:
        encode_video: the model's video front-end, ``(video (n, 1, T, H, W), lengths (n,)) -> (n, D, T)``.
        radius: its stem's temporal half-width (:func:`avsr.inference.video_cache.stem_radius`).
        units: the batch's pieces.  batch: their :func:`model_inputs`.  cache: the video cache.
    """
    read = batch.read
    made = {} if batch.video is None else dict(zip(read, video_features(
        encode_video, batch.video, [units[j].num_frames for j in read], [units[j].video_id for j in read],
        [units[j].change for j in read], cache, radius)))
    feats = [(made[j] if j in made else cache[m.cache_key]).transpose(0, 1) for j, m in enumerate(units)]
    return pad_sequence(feats, batch_first=True).transpose(1, 2).to(batch.lengths.device)


def report(out: list[Transcript], strict: bool, narrowband_trained: bool, log: bool = True) -> None:
    """The warnings of a call: narrowband audio in the transcripts' ``info["warning"]``
    (:func:`avsr.inference.inputs.warn_narrowband`, :func:`~avsr.inference.inputs.warn_low_rate`) and, with
    ``log``, in the log, with video-only items kept as given, audio-visual items decoded audio-only and
    failed items.

    Raises:
        InferenceError: with ``strict``, every failed item named.
    """
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
