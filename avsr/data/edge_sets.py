"""Test sets whose utterances start and end with other silences than the corpus's own (``avsr-edge-test``).

A corpus whose every utterance starts and ends with about the same silence (SynthGRID: 150-300 ms of
festival's pause) lets a model learn where the words are from the edges of the recording; it then fails on
a recording cut closer to the speech, or with a longer pause. :func:`make_edge_test` measures that: each end
of each utterance is either cut to the speech (every silent 40 ms frame removed,
:func:`avsr.features.silent_edges`) or given more frames of silence at the utterance's own noise floor (the
mouth at rest: the edge video frame repeated), audio and video together (:func:`avsr.features.shift_edges`).
The choices are a function of the seed and the utterance id only (:func:`edge_change`). See
:mod:`avsr.bin.edge_sets` for the files written.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import torch
from tqdm import tqdm

from avsr.data.datadir import DataDirError, Utterance, read_datadir, write_datadir, write_kaldi_map
from avsr.data.media import read_video, read_wav, write_video, write_wav
from avsr.data.noise import stable_seed
from avsr.features import SAMPLES_PER_FRAME, shift_edges, silent_edges
from avsr.fileio import settled_media_dir

__all__ = ["edge_change", "make_edge_utterance", "make_edge_test"]

logger = logging.getLogger("avsr.edge_sets")


def edge_change(utt_id: str, silent: tuple[int, int], pad_frames: tuple[int, int],
                seed: int = 0) -> tuple[int, int]:
    """The frames added (> 0) or removed (< 0) at the start and the end of utterance ``utt_id``.

    Each end, independently with probability 1/2: ``-silent[k]`` (cut to the speech) or a number of frames
    drawn uniformly from ``pad_frames[0]..pad_frames[1]`` (a longer pause). A function of ``seed`` and
    ``utt_id`` only.

    Args:
        utt_id: the utterance id.
        silent: silent 40 ms frames at its start and end (:func:`avsr.features.silent_edges`).
        pad_frames: ``(low, high)`` frames of 40 ms, ``0 <= low <= high``.
        seed: seed of the draws.

    Raises:
        ValueError: a malformed ``pad_frames``.
    """
    lo, hi = pad_frames
    if not 0 <= lo <= hi:
        raise ValueError(f"pad_frames must be (low, high) with 0 <= low <= high, got {pad_frames}")
    g = torch.Generator().manual_seed(stable_seed(seed, utt_id, "edge_test"))
    cut = torch.rand(2, generator=g) < 0.5
    pad = torch.randint(lo, hi + 1, (2,), generator=g)
    return tuple(-silent[k] if bool(cut[k]) else int(pad[k]) for k in range(2))  # type: ignore[return-value]


def make_edge_utterance(utt: Utterance, media_dir: Path, pad_frames: tuple[int, int],
                        seed: int = 0) -> tuple[Utterance, tuple[int, int]]:
    """Write the edge-changed copy of one utterance into ``media_dir``; returns its entry and the change.

    An utterance whose two files already exist is not written again (the change is recomputed, it is a
    function of the inputs).

    Raises:
        DataDirError: the utterance has no wav (the silences are found in the audio).
        avsr.data.media.MediaError: a file cannot be read or written.
    """
    if not utt.wav:
        raise DataDirError(f"utterance '{utt.utt_id}' has no wav.scp entry: its silences cannot be found")
    wav = read_wav(utt.wav)
    change = edge_change(utt.utt_id, silent_edges(wav), pad_frames, seed)
    out_wav = media_dir / f"{utt.utt_id}.wav"
    out_mp4 = media_dir / f"{utt.utt_id}.mp4" if utt.video else None
    if not (out_wav.exists() and (out_mp4 is None or out_mp4.exists())):
        if out_mp4 is not None:
            _, video = shift_edges(None, read_video(utt.video), *change)
            write_video(out_mp4, video.numpy())
        g = torch.Generator().manual_seed(stable_seed(seed, utt.utt_id, "edge_test_noise"))
        write_wav(out_wav, shift_edges(wav, None, *change, generator=g)[0])
    # whole frames added or removed: the length changes by exactly start + end frames
    num_frames = (utt.num_frames if utt.num_frames is not None
                  else -(-wav.numel() // SAMPLES_PER_FRAME)) + change[0] + change[1]
    new = replace(utt, wav=str(out_wav), video=str(out_mp4) if out_mp4 else None, num_frames=num_frames)
    return new, change


def make_edge_test(src: Path, dst: Path, pad_frames: tuple[int, int], seed: int = 0,
                   progress: bool = True) -> tuple[list[Utterance], dict[str, tuple[int, int]]]:
    """Write the edge-changed copy of data dir ``src`` as data dir ``dst`` (media in ``<dst>/media``).

    ``<dst>/edge_test.json`` records the source and the options: media made from another source or with
    other options are made anew; otherwise an utterance whose two files exist is kept (an interrupted run
    resumes). ``<dst>/edges`` lists ``<utt-id> <start> <end>``: frames added (> 0) or removed (< 0).

    Returns:
        ``(utterances, changes)``: the new data dir's utterances and utterance id -> ``(start, end)`` change.

    Raises:
        DataDirError: a bad source data dir, an utterance without a wav.
        ValueError: a malformed ``pad_frames``.
        avsr.data.media.MediaError: a file cannot be read or written.
    """
    utts = read_datadir(src)
    settings = {"src": str(src.resolve()), "seed": seed, "pad_frames": list(pad_frames)}
    media = settled_media_dir(dst, settings, "edge_test.json")
    out, changes = [], {}
    for u in tqdm(utts, desc="edge test", disable=not progress):
        new, changes[u.utt_id] = make_edge_utterance(u, media, pad_frames, seed)
        out.append(new)
    write_datadir(dst, out)
    write_kaldi_map(dst / "edges", {u: f"{s} {e}" for u, (s, e) in changes.items()})
    return out, changes
