#!/usr/bin/env python3
"""Write the current tables of RESULTS.md from a run of the recipe.

    local/current_tables.py [EXP_DIR]      # from recipes/synthgrid/avsr1; EXP_DIR e.g. exp/avsr_synthgrid_cpu

RESULTS.md keeps the figures of the main job between marker comments, so that a new run replaces them and
nothing else:

    <!-- BEGIN current tables -->   WER per test set x noise condition x modality, from results.json
    <!-- BEGIN current details -->  per test set: errors by type, words, utterances (the scoring stage's
                                    RESULTS.md)
    <!-- BEGIN corpus tables -->    errors per GRID slot, letter confusions, WER per voice (the scoring
                                    stage's RESULTS.md: local/results_tables.sh)

each closed by its ``<!-- END ... -->``. With EXP_DIR, its ``results.json`` is copied next to RESULTS.md and
the other two blocks are taken from its ``RESULTS.md``; without, the current tables are written again from the
``results.json`` next to RESULTS.md (``tests/test_docs.py`` checks the blocks' figures against it). The
environment, the configuration and the sections on the settings are written by hand.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

from avsr.modalities import MODALITIES

RECIPE = Path(__file__).resolve().parents[1]
BLOCKS = ("current tables", "current details", "corpus tables")


def current_tables(rows: list[dict]) -> str:
    """One WER table: a row per test set and condition (clean, then each noise by falling SNR), a column per
    modality."""
    mods = [m for m in MODALITIES if any(r["modality"] == m for r in rows)]
    wer = {(r["test_set"], r["noise"], r["snr_db"], r["modality"]): r["wer"] for r in rows}
    lines = ["| test set | noise | SNR (dB) | " + " | ".join(mods) + " |",
             "|---|---|---:|" + "---:|" * len(mods)]
    for test_set in sorted({r["test_set"] for r in rows}):
        conds = {(r["noise"], r["snr_db"]) for r in rows if r["test_set"] == test_set}
        for noise, snr in sorted(conds, key=lambda c: (c[0] != "clean", c[0], -(c[1] or 0))):
            cells = [wer.get((test_set, noise, snr, m)) for m in mods]
            lines.append(f"| {test_set} | {noise} | {'-' if snr is None else f'{snr:g}'} | "
                         + " | ".join("-" if c is None else f"{c:.2f}" for c in cells) + " |")
    return "\n".join(lines)


def scoring_sections(exp_results_md: str, test_sets: set[str]) -> tuple[str, str]:
    """A scoring stage's RESULTS.md split into its test sets' tables and the sections after them (before the
    environment), one heading level down."""
    body = exp_results_md[:exp_results_md.index("\n## Environment")]
    sections = [s.strip() for s in re.split(r"\n(?=## )", body)[1:]]
    mine = [s for s in sections if s[3:].splitlines()[0].strip() in test_sets]
    rest = [s for s in sections if s not in mine]
    return tuple(re.sub(r"^## ", "### ", "\n\n".join(part), flags=re.M) for part in (mine, rest))


def replace_block(text: str, name: str, content: str) -> str:
    """``text`` with the block ``name`` (between its marker comments) holding ``content``."""
    begin, end = f"<!-- BEGIN {name} -->", f"<!-- END {name} -->"
    if text.count(begin) != 1 or text.count(end) != 1 or text.index(begin) > text.index(end):
        raise SystemExit(f"RESULTS.md: expected one {begin} ... {end}")
    head, rest = text.split(begin)
    return f"{head}{begin}\n{content.strip()}\n{end}{rest.split(end, 1)[1]}"


def block(text: str, name: str) -> str:
    """The content of the block ``name`` of ``text``."""
    return text.split(f"<!-- BEGIN {name} -->", 1)[1].split(f"<!-- END {name} -->", 1)[0].strip()


def main(argv: list[str]) -> int:
    results_md = RECIPE / "RESULTS.md"
    text = results_md.read_text(encoding="utf-8")
    if argv:
        exp = Path(argv[0])
        shutil.copyfile(exp / "results.json", RECIPE / "results.json")
    rows = json.loads((RECIPE / "results.json").read_text(encoding="utf-8"))
    text = replace_block(text, "current tables", current_tables(rows))
    if argv:
        exp_md = (exp / "RESULTS.md").read_text(encoding="utf-8")
        details, corpus = scoring_sections(exp_md, {r["test_set"] for r in rows})
        text = replace_block(text, "current details", details)
        text = replace_block(text, "corpus tables", corpus)
    results_md.write_text(text, encoding="utf-8")
    print(results_md)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
