"""Long input and the edges of the speech: cutting at pauses, joining the pieces, the silence at the ends.

* Long input: an utterance longer than ``max_segment_s`` is cut at pauses (:func:`pause_cuts`, read from the
  audio's frame energy, :func:`frame_energy_db`, or the mouth's motion, :func:`frame_motion`) into pieces
  that are decoded as utterances of their own and joined (:func:`join`: text, tokens, summed scores, word
  times offset).
* Edges: a model trained on utterances with regular pauses at their ends reads the words by them
  (recipes/synthgrid/avsr1/RESULTS.md, "Silence at the edges"), so every input (and every piece with audio)
  may be given the silent edges of the model's training audio (``edge_frames``: per end a range ``(lo, hi)``
  of silent 40 ms frames, normally the middle half of the training utterances' edges). The change
  (:func:`edge_change`, :func:`avsr.features.edge_shift`) removes silent frames beyond ``hi`` and adds the
  frames missing to ``lo`` as copies of the input's own silence (:func:`avsr.features.own_silence`), the
  video's edge frame repeated (:func:`shifted`); the transcript is put back on the time line of the input
  (:func:`restore_edges`). The edges are found in the audio as decoded (noise mixed in; for a video-only
  decode, the item's audio with the same noise, read only for this); audio whose quietest frame is less
  than 40 dB below its loudest (noise under the whole recording) and video-only items without audio keep
  theirs (``info["edges_note"]``). :func:`parse_edge_frames` reads the setting from a command-line value.

  Video-only input and the recipe's decoding stage: ``avsr.bin.decode`` gives every utterance its
  ``wav.scp`` audio, so its video-only hypotheses are those of a call given the audio as well,
  ``transcriber(video=mp4, audio=wav, modality="video")`` (the audio then only places the edges, the model
  sees the video alone). A call given the video alone cannot find the edges and decodes the video as
  recorded: its hypotheses differ from the stage's wherever the stage changes the edges (9 of 12 utterances
  with random silent edges, for a tiny random model). Both agree when the edges are off
  (``edge_frames=None``, the stage's ``--edge-frames off``), or for a model whose checkpoint records no
  edges.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any

import torch

from avsr.features import SAMPLES_PER_FRAME, edge_ranges, edge_shift, own_silence, shift_edges
from avsr.inference.types import FPS, MAX_EDGE_FRAMES, MIN_FRAMES, InferenceError, Media, Transcript

__all__ = ["EdgeRanges", "DEFAULT_SEGMENT_S", "MIN_SEGMENT_S", "frame_energy_db", "frame_motion",
           "pause_cuts", "check_edges", "parse_edge_frames", "stats_edges", "edge_change", "shifted",
           "segments", "join", "restore_edges"]

logger = logging.getLogger("avsr.inference")

#: the edges of :class:`avsr.inference.Transcriber`: per end (start, end) the range ``(lo, hi)`` of silent
#: 40 ms frames.
EdgeRanges = tuple[tuple[int, int], tuple[int, int]]

#: the longest piece of a long input (``max_segment_s="model"``) when the model does not record its training
#: range, in seconds.
DEFAULT_SEGMENT_S = 15.0
#: the shortest ``max_segment_s`` (seconds): two pieces of ``MIN_FRAMES`` frames.
MIN_SEGMENT_S = 2 * MIN_FRAMES / FPS


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


def check_edges(value: Any, what: str) -> EdgeRanges:
    """:func:`avsr.features.edge_ranges` with the ``MAX_EDGE_FRAMES`` limit.

    Args:
        value: ``(start, end)``, each a count of silent 40 ms frames or a range ``(lo, hi)``.
        what: the name of the value in the message.

    Raises:
        ValueError: not such a pair, or above ``MAX_EDGE_FRAMES`` (50) frames; ``what`` named.
    """
    try:
        ranges = edge_ranges(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be (start, end) with each a count of 40 ms frames or a range "
                         f"(lo, hi), 0 <= lo <= hi <= {MAX_EDGE_FRAMES}, got {value!r}") from None
    if max(ranges[0][1], ranges[1][1]) > MAX_EDGE_FRAMES:
        raise ValueError(f"{what} must be at most {MAX_EDGE_FRAMES} frames at each end, got {value!r}")
    return ranges


def parse_edge_frames(text: str) -> EdgeRanges | str | None:
    """The ``edge_frames`` of :meth:`avsr.inference.Transcriber.from_pretrained` from a command-line value:
    ``model`` (the model's training edges), ``off`` (None: inputs as given), or ``START,END`` with each a
    count of silent 40 ms frames (``5,4``) or a range ``LO-HI`` (``4-6,3-5``).

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
    return check_edges(value, "edge frames")


def stats_edges(stats: Mapping[str, Any]) -> EdgeRanges | None:
    """The edges of a checkpoint's ``data_stats`` (``edge_frames``: ranges, or the single counts of the first
    checkpoints that recorded them), or None when not recorded.

    Raises:
        ValueError: recorded edges that are not valid (:func:`check_edges`).
    """
    edges = stats.get("edge_frames")
    return check_edges([e if isinstance(e, int) else tuple(e) for e in edges], "data_stats edge_frames") \
        if edges else None


def edge_change(edge_frames: EdgeRanges | None, wav: torch.Tensor | None, info: dict[str, Any]
                ) -> tuple[int, int] | None:
    """The change of the edges (:func:`avsr.features.edge_shift`) that gives an input ``edge_frames``.

    Args:
        edge_frames: the wanted edges, or None (nothing changes).
        wav: ``(N,)`` float32 16 kHz: the audio the edges are found in (as decoded, noise mixed in), or None
            (no audio to find them in).
        info: the transcript's facts: ``edges_changed_frames`` (the change) or ``edges_note`` (why the edges
            were kept) is recorded here.

    Returns:
        ``(start, end)`` frames added (+) or removed (-), or None when nothing changes.
    """
    if edge_frames is None:
        return None
    if wav is None:
        info["edges_note"] = "no audio to find the speech's edges in: edges kept"
        return None
    change = edge_shift(wav, edge_frames)
    if change is None:
        info["edges_note"] = ("no silence in the audio (its quietest frame is less than 40 dB below its "
                              "loudest: noise throughout?): edges kept")
        return None
    if change == (0, 0):
        return None
    info["edges_changed_frames"] = list(change)
    return change


def shifted(media: Media, edge_frames: EdgeRanges | None) -> Media:
    """``media`` with the change of its edges (``media.change``) made: audio and video together, the added
    audio the recording's own silence (:func:`avsr.features.own_silence`), the video's edge frame repeated.

    Raises:
        InferenceError: fewer than ``MIN_FRAMES`` frames left (``edge_frames`` named).
    """
    change = media.change
    if change is None:
        return media
    wav, frames = media.wav, media.frames
    silence = own_silence(wav) if wav is not None else None
    wav, frames = shift_edges(wav, frames, change[0], change[1], silence=silence)
    num_frames = media.num_frames + change[0] + change[1]
    if num_frames < MIN_FRAMES:
        raise InferenceError(f"{media.key}: {num_frames} frame(s) are left once the silence at its ends "
                             f"is cut to {edge_frames}; at least {MIN_FRAMES} are needed")
    return dataclasses.replace(media, wav=wav, frames=frames, num_frames=num_frames)


def segments(media: Media, limit: int | None, edge_frames: EdgeRanges | None,
             train_max_s: float | None) -> list[Media]:
    """The units to decode of one item as loaded.

    Args:
        media: the item as loaded (its ``change`` still to make).
        limit: the longest piece in 25 fps frames, or None (never cut).
        edge_frames: the wanted edges of every piece (pieces with audio), or None.
        train_max_s: the longest training utterance in seconds, or None: a longer input that is not cut gets
            ``info["warning"]`` (and a log line).

    Returns:
        ``[media]`` with its edges changed (:func:`shifted`), or, longer than ``limit``, its pieces of at most
        ``limit`` frames cut at pauses (:func:`pause_cuts`), keys ``<key>#<n>``, each with the change of its
        own edges made.

    Raises:
        InferenceError: as :func:`shifted`.
    """
    if limit is None or media.num_frames + sum(media.change or (0, 0)) <= limit:
        whole = shifted(media, edge_frames)
        if train_max_s is not None and whole.num_frames > train_max_s * FPS:
            whole.info["warning"] = (
                f"{whole.num_frames / FPS:.1f} s is longer than the longest training utterance "
                f"({train_max_s:.1f} s): the transcript may degrade; cut it (max_segment_s)")
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
        change = edge_shift(wav, edge_frames) if edge_frames and wav is not None else None
        if change is not None and (change == (0, 0) or stop - start + sum(change) < MIN_FRAMES):
            change = None
        piece = Media(f"{media.key}#{n}", wav, frames, stop - start, dict(info), offset=start,
                      video_id=(media.key, start, stop), change=change)
        if change is not None:
            piece.info["edges_changed_frames"] = list(change)
        out.append(shifted(piece, edge_frames))
    return out


def join(key: str, parts: list[tuple[int, Transcript]]) -> Transcript:
    """One transcript from the ``(offset in frames, transcript)`` of an item's segments: text and tokens in
    time order, scores summed, word times moved by the offsets, ``info["segments_s"]`` (and
    ``segments_edges_changed_frames``) added, the views (:attr:`Transcript.views`) joined the same way; one
    part: the part itself, named ``key``."""
    if len(parts) == 1:
        only = parts[0][1]
        views = only.views and {n: dataclasses.replace(v, key=key) for n, v in only.views.items()}
        return dataclasses.replace(only, key=key, views=views)
    parts = sorted(parts, key=lambda p: p[0])
    words = None
    if all(t.words is not None for _, t in parts):
        words = []
        for off, t in parts:
            shift = off / FPS
            words += [dataclasses.replace(w, start=round(w.start + shift, 3), end=round(w.end + shift, 3))
                      for w in t.words]
    first = parts[0][1]
    views = None
    if all(t.views is not None for _, t in parts):  # each view joined like the transcript
        names = set.intersection(*(set(t.views) for _, t in parts))
        views = {n: join(key, [(off, t.views[n]) for off, t in parts]) for n in sorted(names)}
    info = {**first.info, "segments_s": [[off / FPS, (off + t.num_frames) / FPS] for off, t in parts]}
    info.pop("edges_changed_frames", None)
    if any("edges_changed_frames" in t.info for _, t in parts):
        info["segments_edges_changed_frames"] = [t.info.get("edges_changed_frames") for _, t in parts]
    return Transcript(key=key, text=" ".join(t.text for _, t in parts if t.text),
                      tokens=[x for _, t in parts for x in t.tokens],
                      score=sum(t.score for _, t in parts), words=words, modality=first.modality,
                      num_frames=sum(t.num_frames for _, t in parts), info=info, views=views)


def restore_edges(t: Transcript, change: tuple[int, int] | None) -> Transcript:
    """``t`` (of a unit whose edges were changed by ``change``) on the time line of the unit as read: its
    length and word times (seconds, clipped to the unit) without the change, as a new transcript."""
    if change is None:
        return t
    num_frames = t.num_frames - change[0] - change[1]
    shift, last = change[0] / FPS, num_frames / FPS
    words = t.words if t.words is None else [
        dataclasses.replace(w, start=round(min(max(w.start - shift, 0.0), last), 3),
                            end=round(min(max(w.end - shift, 0.0), last), 3)) for w in t.words]
    return dataclasses.replace(t, num_frames=num_frames, words=words)
