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

See :mod:`avsr.data.edge_sets`.

Usage: ``avsr edge-test --src data/test --dst data/test_edges [--seed 0] [--pad-frames 10 25]`` (or
``python -m avsr.bin.edge_sets ...``)
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from avsr.bin import setup_logging
from avsr.bin.runner import UsageError, tool
from avsr.data.edge_sets import make_edge_test

logger = logging.getLogger("avsr.edge_sets")


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
    setup_logging()
    lo, hi = args.pad_frames
    if not 0 <= lo <= hi:
        raise UsageError(f"--pad-frames must be LOW HIGH with 0 <= LOW <= HIGH, got {lo} {hi}")
    if args.src.resolve() == args.dst.resolve():
        raise UsageError(f"--dst must differ from --src ({args.src})")
    out, changes = make_edge_test(args.src, args.dst, (lo, hi), args.seed, progress=not args.no_progress)
    cut = sum(k < 0 for change in changes.values() for k in change)
    logger.info("%s: %d utterances of %s, %d of %d ends cut to the speech, the others %d-%d frames longer",
                args.dst, len(out), args.src, cut, 2 * len(out), lo, hi)


if __name__ == "__main__":
    sys.exit(main())
