"""Make a data dir from a random subset of another one's utterances (Kaldi's ``utils/subset_data_dir.sh``).

Used for fine-tuning with scarce labels: the pretraining recipe fine-tunes on ``--percent`` of the training
utterances. The choice is a function of ``--seed`` only, and every speaker keeps at least one utterance when
the subset is large enough, so the subset covers the speakers as the full set does. Output files are written
atomically and sorted, as :func:`avsr.data.datadir.write_datadir` does.

Usage: ``python -m avsr.bin.subset_data --src data/train --dst data/train_10pct --percent 10 [--seed 0]``
(or ``--num N``).
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path

from avsr.bin import setup_logging
from avsr.bin.runner import tool
from avsr.data.datadir import choose_subset, read_datadir, write_datadir

logger = logging.getLogger("avsr.subset_data")


@tool("avsr-subset-data")
def main(argv: list[str] | None = None) -> int | None:
    """Command-line entry point (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", required=True, type=Path, help="source data dir")
    p.add_argument("--dst", required=True, type=Path, help="output data dir")
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--percent", type=float, help="share of the utterances, in percent (0, 100]")
    size.add_argument("--num", type=int, help="number of utterances")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    setup_logging()
    utts = read_datadir(args.src, require_text=False)
    if args.percent is not None:
        if not 0 < args.percent <= 100:
            p.error(f"--percent must lie in (0, 100], got {args.percent}")
        num = max(1, math.ceil(len(utts) * args.percent / 100))
    else:
        num = args.num
    if not 1 <= num <= len(utts):
        p.error(f"--num must lie in 1..{len(utts)} (utterances in {args.src}), got {num}")
    subset = choose_subset(utts, num, args.seed)
    write_datadir(args.dst, subset)
    logger.info("%s: %d of the %d utterances of %s, %d speakers", args.dst, len(subset), len(utts), args.src,
                len({u.speaker for u in subset}))


if __name__ == "__main__":
    sys.exit(main())
