"""Phone purity, cluster purity and PNMI of a cluster label file against SynthGRID phone alignments.

Reads ``<data-dir>/<name>.km`` (and its ``.km.json``) and, for every utterance, the festival alignment
``<wav path without .wav>.phn``; frames outside every phone segment count as silence (``pau``) or, with
``--drop-outside``, are left out. Prints a JSON object and a RESULTS.md table row; ``--out`` also writes
the JSON (atomically). Definitions: HuBERT (Hsu et al., 2021), Sec. IV-D; see :mod:`avsr.clustering.quality`.

``--report A.json B.json ... --out quality.md`` instead turns earlier results into one markdown table (the
section the recipe adds to RESULTS.md).

Usage: ``python -m avsr.bin.cluster_quality --labels data/valid/km_mfcc100.km --data-dir data/valid``;
``python -m avsr.bin.cluster_quality --report exp/pt_iter1/km/quality.json exp/pt_iter2/km/quality.json
--out cluster_quality.md``
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from avsr.bin import setup_logging
from avsr.bin.runner import tool
from avsr.clustering.quality import SILENCE, label_quality, quality_report, results_header, results_row
from avsr.fileio import write_text_atomic

logger = logging.getLogger("avsr.cluster_quality")


def _write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically, making its directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text)


@tool("avsr-cluster-quality")
def main(argv: list[str] | None = None) -> int | None:
    """Command-line entry point (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--labels", type=Path, help="the .km label file")
    mode.add_argument("--report", nargs="+", type=Path, help="result JSON files to tabulate as markdown")
    p.add_argument("--data-dir", type=Path, help="its data dir (default: the label file's directory)")
    p.add_argument("--drop-outside", action="store_true",
                   help=f"leave out frames outside every phone segment (default: count them as '{SILENCE}')")
    p.add_argument("--out", type=Path, help="also write the JSON here")
    args = p.parse_args(argv)
    setup_logging()
    if args.report:
        text = quality_report(args.report)
        if args.out is not None:
            _write_atomic(args.out, text)
        print(text)
        return
    data_dir = args.data_dir or args.labels.parent
    result = label_quality(args.labels, data_dir, None if args.drop_outside else SILENCE)
    text = json.dumps(result, indent=1) + "\n"
    if args.out is not None:
        _write_atomic(args.out, text)
    print(text + results_header() + "\n" + results_row(result))


if __name__ == "__main__":
    sys.exit(main())
