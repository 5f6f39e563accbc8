"""SynthGRID error tables for RESULTS.md: errors per GRID slot, letter confusions, WER per voice.

Usage: ``python -m avsr.bin.synthgrid_report --decode-dir exp/<tag>/decode --corpus corpus --out tables.md``
(the SynthGRID recipe's scoring stage runs it and appends the file to RESULTS.md); see
:mod:`avsr.corpora.synthgrid.slots`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from avsr.bin.runner import tool
from avsr.corpora.synthgrid.slots import report_markdown
from avsr.fileio import write_text_atomic


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser."""
    p = argparse.ArgumentParser(prog="python -m avsr.bin.synthgrid_report",
                                description="SynthGRID error tables (per slot, letter confusions, voice).")
    p.add_argument("--decode-dir", required=True, type=Path, help="DIR/<test_set>/<modality>/<condition>/")
    p.add_argument("--corpus", type=Path, default=None,
                   help="SynthGRID corpus (its speakers.json gives the WER per voice)")
    p.add_argument("--out", required=True, type=Path, help="markdown file to write")
    p.add_argument("--top", type=int, default=10, help="letter confusions listed per modality")
    return p


@tool("avsr-synthgrid-report")
def main(argv: list[str] | None = None) -> int | None:
    """Entry point of ``python -m avsr.bin.synthgrid_report``; returns the exit status."""
    args = build_parser().parse_args(argv)
    if not args.decode_dir.is_dir():
        raise FileNotFoundError(f"decode dir not found: {args.decode_dir}")
    text = report_markdown(args.decode_dir, args.corpus, args.top)
    write_text_atomic(args.out, text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
