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

import torch

from avsr.bin.runner import tool
from avsr.data.datadir import Utterance, read_datadir, write_datadir

logger = logging.getLogger("avsr.subset_data")


def choose_subset(utts: list[Utterance], num: int, seed: int = 0) -> list[Utterance]:
    """``num`` utterances of ``utts``, drawn at random but spread over the speakers.

    One utterance per speaker is taken first (in a random speaker order, as long as ``num`` allows), the
    rest uniformly from the remaining utterances; the result is sorted by utterance id.

    Raises:
        ValueError: ``num`` is not in ``1..len(utts)``.
    """
    if not 1 <= num <= len(utts):
        raise ValueError(f"subset size must lie in 1..{len(utts)}, got {num}")
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(utts), generator=g).tolist()
    chosen: list[int] = []
    seen: set[str] = set()
    for i in order:  # first utterance of each speaker in the random order
        if len(chosen) < num and utts[i].speaker not in seen:
            seen.add(utts[i].speaker)
            chosen.append(i)
    taken = set(chosen)
    chosen += [i for i in order if i not in taken][: num - len(chosen)]
    return sorted((utts[i] for i in chosen), key=lambda u: u.utt_id)


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
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
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
