"""Write the recipe's RESULTS.md: ESPnet-trained WER beside avsr's own recipe on the same test set.

Usage: ``local/compare.py --espnet exp/x/results.json --avsr ../avsr1/results.json --exp exp/x
--out RESULTS.md [--notes local/results_notes.md]``

Reads both ``results.json`` files (``avsr.bin.score``'s rows), the stage times of ``exp/x/stage_times.tsv``,
the per-epoch ESPnet results of ``exp/x/logs/stage4.log`` and the training curves ESPnet drew in
``exp/x/images/`` (the four shown are copied next to RESULTS.md as ``images/``, so that the links work in
the repository).
``--notes``: a Markdown file (measurements and how the runs differ) placed after the WER table.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

#: the training curves of ESPnet's ``images/`` that RESULTS.md shows (copied next to it)
CURVES = ("acc", "cer_ctc", "loss", "optim0_lr0")


def _key(row: dict) -> tuple:
    return row["test_set"], row["noise"], row["snr_db"], row["modality"]


def _order(row: dict) -> tuple:
    return (
        row["noise"] != "clean",
        -(row["snr_db"] or 0),
        ["audio", "video", "audiovisual"].index(row["modality"]),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--espnet", required=True, type=Path)
    p.add_argument("--avsr", required=True, type=Path)
    p.add_argument("--exp", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    p.add_argument(
        "--pre-beam",
        type=Path,
        default=None,
        help="results.json of the pre_beam_espnet / pre_beam_avsr decodings (avsr.bin.score)",
    )
    p.add_argument("--notes", type=Path, default=None, help="Markdown placed after the WER table")
    args = p.parse_args(argv)
    esp = json.loads(args.espnet.read_text(encoding="utf-8"))
    ours = {
        _key(r): r
        for r in json.loads(args.avsr.read_text(encoding="utf-8"))
        if r.get("system") in (None, "avsr_synthgrid_cpu")
    }
    lines = [
        "# SynthGRID in ESPnet2 with avsr's AV-HuBERT encoder",
        "",
        "WER (%) on the test utterances of `../avsr1` (same corpus, same noisy audio), ESPnet's model "
        "(`encoder: avsr_avhubert`, ESPnet's transformer decoder, CTC, trainer and `Speech2Text` "
        "search) beside avsr's default recipe (`../avsr1/RESULTS.md`).",
        "",
        "| noise | SNR (dB) | modality | ESPnet | (utterances) | avsr | (utterances) |",
        "|---|---:|---|---:|---:|---:|---:|",
    ]
    for r in sorted(esp, key=_order):
        o = ours.get(_key(r))
        snr = "-" if r["snr_db"] is None else f"{r['snr_db']:g}"
        theirs = f"{o['wer']:.2f} | {o['num_utts']}" if o else "- | -"
        head = f"| {r['noise']} | {snr} | {r['modality']}"
        lines.append(f"{head} | {r['wer']:.2f} | {r['num_utts']} | {theirs} |")
    if args.notes is not None:
        lines += ["", args.notes.read_text(encoding="utf-8").rstrip()]
    if args.pre_beam is not None and args.pre_beam.is_file():
        rows = json.loads(args.pre_beam.read_text(encoding="utf-8"))
        by = {(r["system"], *_key(r)): r for r in rows}
        lines += [
            "",
            "## The pre-beam: ESPnet's ranking and avsr's on this model",
            "",
            "The same ESPnet model and `Speech2Text` search, with the pre-beam of partial CTC scoring "
            "ranked as ESPnet does (`pre_beam: espnet`) and as avsr's default (`pre_beam: avsr`, through "
            "`avsr.espnet.scorers.use_avsr_pre_beam`), WER %:",
            "",
            "| noise | SNR (dB) | modality | pre_beam espnet | pre_beam avsr | utterances |",
            "|---|---:|---|---:|---:|---:|",
        ]
        for r in sorted((r for r in rows if r["system"] == "pre_beam_avsr"), key=_order):
            e = by.get(("pre_beam_espnet", *_key(r)))
            snr = "-" if r["snr_db"] is None else f"{r['snr_db']:g}"
            head = f"| {r['noise']} | {snr} | {r['modality']}"
            lines.append(f"{head} | {e['wer']:.2f} | {r['wer']:.2f} | {r['num_utts']} |")
    times = args.exp / "stage_times.tsv"
    if times.is_file():
        names = {
            "1": "corpus",
            "2": "dump",
            "3": "collect_stats",
            "4": "training",
            "5": "decoding",
            "6": "scoring",
        }
        rows = [line.split("\t") for line in times.read_text().split("\n") if line.strip()]
        lines += ["", "Stage times (s): " + ", ".join(f"{names.get(n, n)} {t}" for n, t in rows) + "."]
    log = args.exp / "logs" / "stage4.log"
    if log.is_file():
        lines += ["", "ESPnet's per-epoch results (`exp/.../logs/stage4.log`):", "", "```"]
        for m in re.finditer(r"(\d+epoch results: .*)", log.read_text(encoding="utf-8", errors="replace")):
            lines.append(m.group(1)[:400])
        lines.append("```")
    images = args.exp / "images"
    if images.is_dir():
        dst = args.out.parent / "images"
        dst.mkdir(parents=True, exist_ok=True)
        pngs = [png for png in sorted(images.glob("*.png")) if png.stem in CURVES]
        for png in pngs:
            shutil.copy2(png, dst / png.name)
        lines += [
            "",
            "Training curves drawn by ESPnet's trainer (`exp/.../images/`, copied to `images/`):",
            "",
        ]
        lines += [f"![{png.stem}](images/{png.name})" for png in pngs]
    extra = args.espnet.parent / "RESULTS.md"
    if extra.is_file():
        lines += [
            "",
            "## Scoring details (avsr.bin.score)",
            "",
            extra.read_text(encoding="utf-8").split("\n", 1)[1],
        ]
    args.out.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
