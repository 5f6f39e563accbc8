"""Make a test data dir whose utterances start and end with other silences than the corpus's own.

A corpus whose every utterance starts and ends with about the same silence (SynthGRID: 150-300 ms of
festival's pause) lets a model learn where the words are from the edges of the recording; it then fails on
a recording cut closer to the speech, or with a longer pause, as a user's own recording may be
(recipes/synthgrid/avsr1/RESULTS.md, "Silence at the edges"). This tool measures that: each end of each
utterance is either cut to the speech (every silent 40 ms frame removed, :func:`avsr.features.silent_edges`)
or given ``--pad-frames`` more frames of silence at the utterance's own noise floor (the mouth at rest: the
edge video frame repeated), audio and video together (:func:`avsr.features.shift_edges`). The choices are a
function of ``--seed`` and the utterance id only: the same test set on every machine, as SynthGRID's corpus.

The new media go to ``<dst>/media/<utt-id>.{wav,mp4}`` (written atomically; an utterance whose two files
exist is kept, so an interrupted run resumes; ``<dst>/edge_test.json`` records the source and the options,
and a run with others starts the media over), the data dir files to ``<dst>`` with ``utt2num_frames`` of
the new lengths. ``<dst>/edges`` lists what was done to each utterance: ``<utt-id> <start> <end>`` in
frames (> 0 added, < 0 removed).

Usage: ``python -m avsr.bin.edge_test --src data/test --dst data/test_edges [--seed 0] [--pad-frames 10 25]``
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import torch
from tqdm import tqdm

from avsr.bin.runner import UsageError, tool
from avsr.data.datadir import DataDirError, Utterance, read_datadir, write_datadir, write_kaldi_map
from avsr.data.media import read_video, read_wav, write_video, write_wav
from avsr.data.noise import stable_seed
from avsr.features import SAMPLES_PER_FRAME, shift_edges, silent_edges
from avsr.fileio import write_text_atomic

logger = logging.getLogger("avsr.edge_test")


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


@tool("avsr-edge-test")
def main(argv: list[str] | None = None) -> int | None:
    """Command-line entry point (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", required=True, type=Path, help="source data dir (wav.scp needed)")
    p.add_argument("--dst", required=True, type=Path, help="output data dir (media in <dst>/media)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pad-frames", type=int, nargs=2, default=(10, 25), metavar=("LOW", "HIGH"),
                   help="frames of 40 ms added at an end that is not cut (default 10 25: 0.4-1.0 s)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    lo, hi = args.pad_frames
    if not 0 <= lo <= hi:
        raise UsageError(f"--pad-frames must be LOW HIGH with 0 <= LOW <= HIGH, got {lo} {hi}")
    if args.src.resolve() == args.dst.resolve():
        raise UsageError(f"--dst must differ from --src ({args.src})")
    utts = read_datadir(args.src)
    media = args.dst / "media"
    settings = {"src": str(args.src.resolve()), "seed": args.seed, "pad_frames": [lo, hi]}
    record = args.dst / "edge_test.json"
    if media.exists() and (not record.exists() or json.loads(record.read_text()) != settings):
        logger.info("%s was made from another source or with other options: its media are made anew",
                    args.dst)
        shutil.rmtree(media)
    media.mkdir(parents=True, exist_ok=True)
    write_text_atomic(record, json.dumps(settings, indent=1) + "\n")
    out, changes = [], {}
    for u in tqdm(utts, desc="edge test", disable=args.no_progress):
        new, changes[u.utt_id] = make_edge_utterance(u, media, (lo, hi), args.seed)
        out.append(new)
    write_datadir(args.dst, out)
    write_kaldi_map(args.dst / "edges", {u: f"{s} {e}" for u, (s, e) in changes.items()})
    cut = sum(k < 0 for change in changes.values() for k in change)
    logger.info("%s: %d utterances of %s, %d of %d ends cut to the speech, the others %d-%d frames longer",
                args.dst, len(out), args.src, cut, 2 * len(out), lo, hi)


if __name__ == "__main__":
    sys.exit(main())
