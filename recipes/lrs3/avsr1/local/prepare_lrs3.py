#!/usr/bin/env python3
"""Stage 1 of the LRS3 recipe (corpus part): splits, transcripts, ROI work list, speech-noise candidates.

Reads an LRS3 directory (``<root>/{pretrain,trainval,test}/<speaker>/<clip>.{mp4,txt}``) and writes, with
:mod:`avsr.data.lrs3` (which documents the AV-HuBERT facts it follows):

* ``<corpus>/{train,valid,test[,pretrain_all]}/<speaker>/<utt>.txt``: one upper-case transcript line;
* ``<corpus>/roi.list``: the work list of the template's stage 2 (``--roi-list``): ``<src.mp4>
  <split>/<speaker>/<utt>.mp4 [<start_s> <end_s>]``;
* ``<corpus>/local/speech_noise.list``: training utterances to cut LRS3 speech noise from (AV-HuBERT's
  ``lrs3_noise.py``), in a seeded random order: ``<src.mp4> <start_s> <end_s|-1> <duration_s|?>``;
* ``<corpus>/local/splits.json``: the options and the number of utterances of every split.

Usage: ``local/prepare_lrs3.py --lrs3-root /data/lrs3 --corpus-dir corpus [--labeled 30h|433h]
[--include-pretrain true|false] [--valid-ids lrs3-valid.id | --num-valid 1200] [--max-seconds 20] [--seed 0]``
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
from pathlib import Path

from avsr.data.lrs3 import LRS3Error, choose_valid, make_splits, scan_part, write_corpus

logger = logging.getLogger("prepare_lrs3")


def _bool(value: str) -> bool:
    if value.lower() in ("true", "1", "yes"):
        return True
    if value.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def speech_noise_lines(utts, seed: int) -> list[str]:
    """Candidate lines for LRS3 speech noise: every training utterance in a seeded random order, with its
    estimated duration when the word timings give it (``pretrain``), else ``?`` (the noise tool probes)."""
    lines = []
    for u in utts:
        duration = "?" if u.duration is None else f"{u.duration:.3f}"
        end = -1 if u.end is None else u.end
        lines.append(f"{u.src.resolve()} {u.start:.3f} {end:.3f} {duration}")
    random.Random(seed).shuffle(lines)
    return lines


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point (see the module docstring). Returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lrs3-root", required=True, type=Path, help="LRS3 root (pretrain/, trainval/, test/)")
    p.add_argument("--corpus-dir", required=True, type=Path)
    p.add_argument(
        "--labeled",
        default="30h",
        choices=["30h", "433h"],
        help="labeled training data: trainval (30h) or pretrain + trainval (433h)",
    )
    p.add_argument(
        "--include-pretrain",
        type=_bool,
        default=None,
        help="prepare LRS3 pretrain/ (default: true for 433h; with 30h: a pretrain_all split of 433 h "
        "for self-supervised pretraining)",
    )
    p.add_argument(
        "--valid-ids",
        type=Path,
        default=None,
        help="AV-HuBERT's validation list (avhubert/preparation/data/lrs3-valid.id)",
    )
    p.add_argument(
        "--num-valid", type=int, default=1200, help="without --valid-ids: utterances drawn at random"
    )
    p.add_argument(
        "--max-seconds",
        type=float,
        default=20.0,
        help="leave training utterances longer than this out (AV-HuBERT: max_sample_size 500 frames); 0: "
        "keep all",
    )
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    include_pretrain = args.include_pretrain if args.include_pretrain is not None else args.labeled == "433h"
    if args.labeled == "433h" and not include_pretrain:
        p.error("--labeled 433h needs the pretrain directory (--include-pretrain true)")
    try:
        parts = ["trainval", "test"] + (["pretrain"] if include_pretrain else [])
        utts = {part: scan_part(args.lrs3_root, part) for part in parts}
        for part, items in utts.items():
            logger.info("%s: %d utterances, %d speakers", part, len(items), len({u.speaker for u in items}))
        valid_ids = None
        if args.valid_ids is not None:
            if not args.valid_ids.is_file():
                raise LRS3Error(f"--valid-ids file not found: {args.valid_ids}")
            valid_ids = args.valid_ids.read_text(encoding="utf-8").splitlines()
        valid = choose_valid(utts["trainval"], valid_ids, args.num_valid, args.seed)
        splits = make_splits(utts, valid, args.labeled, include_pretrain, args.max_seconds)
        roi_lines = write_corpus(splits, args.corpus_dir)
        noise_pool = splits.get("pretrain_all", splits["train"])
        noise_lines = speech_noise_lines(noise_pool, args.seed)
    except LRS3Error as exc:
        print(f"prepare_lrs3: error: {exc}", file=sys.stderr)
        return 1
    _write(args.corpus_dir / "roi.list", "".join(f"{line}\n" for line in roi_lines))
    _write(args.corpus_dir / "local" / "speech_noise.list", "".join(f"{line}\n" for line in noise_lines))
    summary = {
        "lrs3_root": str(args.lrs3_root.resolve()),
        "labeled": args.labeled,
        "include_pretrain": include_pretrain,
        "valid_ids": str(args.valid_ids) if args.valid_ids else None,
        "num_valid": len(splits["valid"]),
        "max_seconds": args.max_seconds,
        "seed": args.seed,
        "utterances": {name: len(items) for name, items in splits.items()},
        "speakers": {name: len({u.speaker for u in items}) for name, items in splits.items()},
        "pretrain_pieces": sum(u.piece is not None for items in splits.values() for u in items),
    }
    _write(args.corpus_dir / "local" / "splits.json", json.dumps(summary, indent=2) + "\n")
    for name, count in summary["utterances"].items():
        logger.info("%s: %d utterances, %d speakers", name, count, summary["speakers"][name])
    logger.info("%d videos to crop listed in %s", len(roi_lines), args.corpus_dir / "roi.list")
    return 0


if __name__ == "__main__":
    sys.exit(main())
