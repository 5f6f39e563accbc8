"""Make test data dirs with other lips than the corpus's own: ``<src>_other_lips`` (another utterance's
mouth), ``<src>_frozen_mouth`` (one frame held) -- video that does not say the transcript -- and
``<src>_photo_lips`` (a real photograph's mouth moved by the utterance), each with the source's audio and
transcripts.

An audio-visual model must be no worse on them than on the audio alone. The media go to
``<dst>/media/<utt-id>.mp4`` (an utterance whose mp4 exists is kept, so an interrupted run resumes). See
:mod:`avsr.data.lip_sets`.

Usage: ``python -m avsr.bin.lip_sets --src data/test --dst-prefix data/test [--sets other_lips
frozen_mouth photo_lips] [--seed 0]``
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from avsr.bin import setup_logging
from avsr.bin.runner import tool
from avsr.data.lip_sets import LIP_SETS, make_lip_set

logger = logging.getLogger("avsr.lip_sets")


@tool("avsr-lip-sets")
def main(argv: list[str] | None = None) -> int | None:
    """Command-line entry point (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", required=True, type=Path, help="source data dir (video.scp needed)")
    p.add_argument("--dst-prefix", required=True, type=Path,
                   help="the sets are written to <dst-prefix>_<set> (e.g. data/test -> data/test_other_lips)")
    p.add_argument("--sets", nargs="+", default=list(LIP_SETS), choices=list(LIP_SETS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    setup_logging()
    for name in args.sets:
        dst = args.dst_prefix.parent / f"{args.dst_prefix.name}_{name}"
        out = make_lip_set(args.src, dst, name, args.seed, progress=not args.no_progress)
        logger.info("%s: %d utterances of %s with %s", dst, len(out), args.src, name.replace("_", " "))


if __name__ == "__main__":
    sys.exit(main())
