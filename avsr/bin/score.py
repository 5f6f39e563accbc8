"""Score a decode dir: WER per test set x modality x noise condition -> results.json, RESULTS.md, plot.

Layout read (written by ``python -m avsr.bin.decode``)::

    DECODE_DIR/<test_set>/<modality>/<condition>/{hyp|text|hyp.trn, ref|ref.trn}

with ``<modality>`` in audio, video, audiovisual and ``<condition>`` ``clean`` or ``<noise>_<snr_db>``
(``babble_-5``); ``hyp``/``text``/``ref`` are Kaldi text files (``<utt-id> WORDS``), ``*.trn`` sclite trn
files (``WORDS (<utt-id>)``). See :mod:`avsr.eval.scoring`.

Writes ``OUT/results.json``, ``OUT/RESULTS.md`` and ``OUT/wer_vs_snr.png`` (atomically), prints the WER table,
and prints the path of ``results.json`` as its last line. Exit status 1 with a message naming the file,
directory or utterance on bad input.

Several systems (e.g. pretrained + fine-tuned versus trained from scratch) are scored together with
``--system NAME=DECODE_DIR`` (repeated): every row of ``results.json`` then has a ``"system"`` field, and
RESULTS.md begins with a table comparing the systems. ``--append FILE`` adds markdown (e.g. cluster quality)
to RESULTS.md.

Usage: ``python -m avsr.bin.score --decode-dir exp/x/decode --out exp/x [--notes "model: ..."]``;
``python -m avsr.bin.score --system pretrained=exp/a/decode --system scratch=exp/b/decode --out exp``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from avsr.bin.runner import tool
from avsr.eval.scoring import ScoringError, collect_decode_dir, collect_systems, row_line, write_results


@tool("avsr-score")
def main(argv: list[str] | None = None) -> int | None:
    """Command-line entry point (see the module docstring). Returns the exit status."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--decode-dir", type=Path, help="DIR/<test_set>/<modality>/<condition>/")
    src.add_argument("--system", action="append", metavar="NAME=DECODE_DIR",
                     help="a named system's decode dir (repeat for each system)")
    p.add_argument("--append", nargs="*", default=[], type=Path, help="markdown files to add to RESULTS.md")
    p.add_argument("--out", required=True, type=Path, help="directory for results.json, RESULTS.md, plot")
    p.add_argument("--notes", default="", help="free text for the environment section of RESULTS.md")
    p.add_argument("--title", default="Results", help="heading of RESULTS.md")
    args = p.parse_args(argv)
    rows = collect_systems(args.system) if args.decode_dir is None else collect_decode_dir(args.decode_dir)
    extra = []
    for f in args.append:
        if not f.is_file():
            raise ScoringError(f"--append: file not found: {f}")
        extra.append(f.read_text(encoding="utf-8"))
    path = write_results(args.out, rows, notes=args.notes, title=args.title, extra_md="\n\n".join(extra))
    for r in rows:
        print(row_line(r))
    print(Path(path).resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
