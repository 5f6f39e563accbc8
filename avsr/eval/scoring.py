"""Word error rates per test set x modality x noise condition, and the files that report them.

WER = (substitutions + deletions + insertions) / reference words, in percent, from a Levenshtein alignment
of the word sequences (jiwer's ``process_words``), summed over the utterances of a condition (corpus-level
WER, as sclite and ESPnet's ``score_wer`` report it). Words are compared as they are: no case folding or
punctuation removal (references and hypotheses are both upper-case in avsr).

Decode-dir layout read by :func:`collect_decode_dir` (written by ``python -m avsr.bin.decode``)::

    DIR/<test_set>/<modality>/<condition>/
        hyp | text | hyp.trn     hypotheses (first one found, in that order)
        ref | ref.trn            references
        failed                   utterances that could not be decoded, ``<utt-id> <reason>`` (optional)

* ``<modality>``: ``audio``, ``video`` or ``audiovisual``;
* ``<condition>``: ``clean``, or ``<noise>_<snr_db>`` (``babble_-5``, ``babble_10``, ``white_2.5``; the SNR
  follows the last underscore);
* ``hyp``, ``text``, ``ref``: Kaldi text files, one ``<utt-id> WORD WORD...`` per line (an id alone means an
  empty transcript); ``*.trn``: sclite trn lines ``WORD WORD... (<utt-id>)``.

Other files and sub-directories of a condition directory, and names starting with ``.``, are ignored.
Every reference utterance needs a hypothesis or a ``failed`` line, and every hypothesis a reference
(:class:`ScoringError` names the utterance). A failed utterance counts as an empty hypothesis (all its
reference words deleted), and the row says how many failed (``num_failed``).

Outputs (:func:`write_results`, each file written atomically): ``results.json`` (list of rows, see
:func:`score_condition`), ``RESULTS.md`` (tables and the environment) and ``wer_vs_snr.png``.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import platform
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import jiwer

from avsr.fileio import atomic_path, write_text_atomic
from avsr.modalities import MODALITIES

__all__ = [
    "MODALITIES",
    "collect_systems",
    "row_line",
    "ScoringError",
    "read_transcripts",
    "word_errors",
    "parse_condition",
    "score_condition",
    "collect_decode_dir",
    "sort_rows",
    "systems_of",
    "environment_info",
    "format_results_md",
    "plot_wer_vs_snr",
    "write_results",
]

HYP_NAMES = ("hyp", "text", "hyp.trn")
REF_NAMES = ("ref", "ref.trn")
ROW_KEYS = ("test_set", "modality", "noise", "snr_db", "wer", "num_words", "num_utts")
_TRN_LINE = re.compile(r"^(?P<words>.*?)\s*\((?P<id>[^()\s]+)\)\s*$")


class ScoringError(ValueError):
    """Bad scoring input: unreadable transcript file, missing or extra utterance, bad decode-dir layout.

    The message names the file, directory or utterance."""


def read_transcripts(path: str | os.PathLike) -> dict[str, str]:
    """Read a transcript file: sclite trn if its name ends in ``.trn``, else Kaldi text.

    Args:
        path: the file.

    Returns:
        utt-id -> words joined by single spaces (``""`` for an empty transcript).

    Raises:
        ScoringError: missing file, a line without an id, a malformed trn line, a duplicate id (each named
            with file and line number).
    """
    path = Path(path)
    if not path.is_file():
        raise ScoringError(f"transcript file not found: {path}")
    out: dict[str, str] = {}
    trn = path.name.endswith(".trn")
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            if trn:
                m = _TRN_LINE.match(line)
                if m is None:
                    raise ScoringError(f"{path}:{lineno}: not a trn line 'WORDS (utt-id)': {line!r}")
                utt, words = m.group("id"), m.group("words")
            else:
                utt, _, words = line.partition(" ")
            if utt in out:
                raise ScoringError(f"{path}:{lineno}: duplicate utterance id '{utt}'")
            out[utt] = " ".join(words.split())
    return out


def word_errors(refs: Mapping[str, str], hyps: Mapping[str, str], where: str = "") -> dict[str, int]:
    """Count word errors of ``hyps`` against ``refs`` (both utt-id -> words).

    Returns:
        ``{"sub", "del", "ins", "num_words", "num_utts"}`` (integers, summed over utterances).

    Raises:
        ScoringError: a reference utterance has no hypothesis, or a hypothesis no reference (the message
            names the utterance and ``where``).
    """
    prefix = f"{where}: " if where else ""
    missing = sorted(set(refs) - set(hyps))
    if missing:
        raise ScoringError(f"{prefix}no hypothesis for utterance '{missing[0]}' ({len(missing)} missing)")
    extra = sorted(set(hyps) - set(refs))
    if extra:
        raise ScoringError(
            f"{prefix}hypothesis for utterance '{extra[0]}' has no reference ({len(extra)} extra)"
        )
    ids = sorted(refs)
    if not ids:
        raise ScoringError(f"{prefix}no utterances to score")
    out = jiwer.process_words([refs[u] for u in ids], [hyps[u] for u in ids])
    num_words = sum(len(refs[u].split()) for u in ids)
    return {
        "sub": out.substitutions,
        "del": out.deletions,
        "ins": out.insertions,
        "num_words": num_words,
        "num_utts": len(ids),
    }


def parse_condition(name: str) -> tuple[str, float | int | None]:
    """``"clean"`` -> ``("clean", None)``; ``"babble_-5"`` -> ``("babble", -5)``; ``"white_2.5"`` ->
    ``("white", 2.5)`` (SNR in dB after the last underscore; int when whole).

    Raises:
        ScoringError: any other form (the message names ``name``).
    """
    if name == "clean":
        return "clean", None
    noise, sep, snr = name.rpartition("_")
    try:
        value = float(snr)
    except ValueError:
        value = math.nan
    if not sep or not noise or noise == "clean" or not math.isfinite(value):
        raise ScoringError(
            f"condition directory '{name}' must be 'clean' or '<noise>_<snr_db>' (e.g. babble_-5)"
        )
    return noise, int(value) if value.is_integer() else value


def score_condition(
    cond_dir: str | os.PathLike, test_set: str, modality: str, noise: str, snr_db: float | None
) -> dict[str, Any]:
    """Score one condition directory (see the module docstring for its files).

    Returns:
        A results row: ``test_set, modality, noise, snr_db (None when clean), wer`` (percent),
        ``num_words, num_utts, sub, del, ins, num_failed`` (utterances that could not be decoded, counted
        as empty hypotheses), ``num_audio_only`` (audio-visual utterances decoded from their audio alone
        because their video could not be used: the condition's ``audio_only`` file).

    Raises:
        ScoringError: missing hyp/ref file, unreadable file, missing/extra utterance, no reference word.
    """
    cond_dir = Path(cond_dir)
    hyp = next((cond_dir / n for n in HYP_NAMES if (cond_dir / n).is_file()), None)
    ref = next((cond_dir / n for n in REF_NAMES if (cond_dir / n).is_file()), None)
    if hyp is None or ref is None:
        what = (
            "hypothesis file (" + "|".join(HYP_NAMES)
            if hyp is None
            else "reference file (" + "|".join(REF_NAMES)
        )
        raise ScoringError(f"{cond_dir}: no {what})")
    hyps = read_transcripts(hyp)
    failed_file = cond_dir / "failed"
    failed = read_transcripts(failed_file) if failed_file.is_file() else {}
    both = sorted(set(failed) & set(hyps))
    if both:
        raise ScoringError(f"{failed_file}: utterance '{both[0]}' is listed as failed but has a hypothesis "
                           f"in {hyp}")
    # an utterance that could not be decoded counts as an empty hypothesis: all its words deleted
    hyps.update(dict.fromkeys(failed, ""))
    audio_only_file = cond_dir / "audio_only"
    audio_only = read_transcripts(audio_only_file) if audio_only_file.is_file() else {}
    counts = word_errors(read_transcripts(ref), hyps, where=f"{hyp} vs {ref}")
    if counts["num_words"] == 0:
        raise ScoringError(f"{ref}: references have no words, WER undefined")
    errors = counts["sub"] + counts["del"] + counts["ins"]
    return {
        "test_set": test_set,
        "modality": modality,
        "noise": noise,
        "snr_db": snr_db,
        "wer": round(100.0 * errors / counts["num_words"], 4),
        **counts,
        "num_failed": len(failed),
        "num_audio_only": len(audio_only),
    }


def _subdirs(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))


def collect_decode_dir(decode_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """Score every ``<test_set>/<modality>/<condition>`` directory of ``decode_dir``.

    Returns:
        Rows sorted by :func:`sort_rows`.

    Raises:
        ScoringError: ``decode_dir`` missing or holding no condition, an unknown modality or condition
            directory name, or any error of :func:`score_condition`.
    """
    decode_dir = Path(decode_dir)
    if not decode_dir.is_dir():
        raise ScoringError(f"decode dir not found: {decode_dir}")
    rows = []
    for test_dir in _subdirs(decode_dir):
        for mod_dir in _subdirs(test_dir):
            if mod_dir.name not in MODALITIES:
                raise ScoringError(f"{mod_dir}: modality directory must be one of {MODALITIES}")
            for cond_dir in _subdirs(mod_dir):
                noise, snr = parse_condition(cond_dir.name)
                rows.append(score_condition(cond_dir, test_dir.name, mod_dir.name, noise, snr))
    if not rows:
        raise ScoringError(f"{decode_dir}: no <test_set>/<modality>/<condition>/ directory found")
    return sort_rows(rows)


def collect_systems(specs: Iterable[str]) -> list[dict[str, Any]]:
    """Score the decode dirs of several systems, ``NAME=DECODE_DIR`` each: the rows of
    :func:`collect_decode_dir` with a ``"system"`` field (first), in the order given.

    Raises:
        ScoringError: a malformed spec (named), or as :func:`collect_decode_dir`.
    """
    rows = []
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ScoringError(f"--system must be NAME=DECODE_DIR, got {spec!r}")
        rows += [{"system": name, **r} for r in collect_decode_dir(path)]
    return rows


def row_line(row: Mapping[str, Any]) -> str:
    """One result row as a line of text: system, test set, modality, noise, SNR (dB), WER (%), the words and
    utterances, and the failed utterances (counted as deleted) if any."""
    snr = "" if row["snr_db"] is None else f"{row['snr_db']:g} dB"
    return (
        f"{row['system'] + '  ' if 'system' in row else ''}{row['test_set']:<12} {row['modality']:<12} "
        f"{row['noise']:<8} {snr:>7}  "
        f"WER {row['wer']:6.2f}%  "
        f"({row['num_words']} words, {row['num_utts']} utts"
        + (f", {row['num_failed']} FAILED: counted as deleted)" if row.get("num_failed") else ")")
    )


def _noise_key(row: Mapping[str, Any]) -> tuple:
    clean = row["noise"] == "clean"
    return (not clean, row["noise"], -math.inf if row["snr_db"] is None else row["snr_db"])


def sort_rows(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rows ordered by system (when rows name one; first-seen order), test set, noise (clean first), SNR
    ascending, modality (audio, video, audiovisual)."""
    rows = [dict(r) for r in rows]
    systems = list(dict.fromkeys(r.get("system", "") for r in rows))
    return sorted(
        rows,
        key=lambda r: (systems.index(r.get("system", "")), r["test_set"], *_noise_key(r),
                       MODALITIES.index(r["modality"])),
    )


def systems_of(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """The distinct ``system`` fields of ``rows`` in first-seen order (``[""]`` when rows name none)."""
    return list(dict.fromkeys(r.get("system", "") for r in rows))


def _check_rows(rows: list[dict[str, Any]]) -> None:
    for i, row in enumerate(rows):
        missing = [k for k in ROW_KEYS if k not in row]
        if missing:
            raise ScoringError(f"results row {i} lacks {missing}: {row}")
        if row["modality"] not in MODALITIES:
            raise ScoringError(
                f"results row {i}: modality must be one of {MODALITIES}, got {row['modality']!r}"
            )
        if (row["noise"] == "clean") != (row["snr_db"] is None):
            raise ScoringError(f"results row {i}: snr_db must be null exactly when noise is 'clean': {row}")


def environment_info(notes: str = "") -> dict[str, str]:
    """Date (UTC), Python, torch, CPU and GPU descriptions, and ``notes`` (free text), for RESULTS.md."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        if names:
            cpu = names[0]
    except OSError:
        pass
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "torch": "not installed",
        "cpu": f"{cpu} ({os.cpu_count()} cores)",
        "gpu": "none",
    }
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    except ImportError:
        pass
    if notes:
        info["notes"] = notes
    return info


def _fmt_snr(snr: float | None) -> str:
    return "-" if snr is None else f"{snr:g}"


def _comparison_md(rows: list[dict[str, Any]], systems: list[str]) -> list[str]:
    """A table with one column per system: rows test set x condition x modality."""
    lines = ["## Systems compared", "", "WER (%); each column is one system.", "",
             "| test set | noise | SNR (dB) | modality | " + " | ".join(systems) + " |",
             "|---|---|---:|---|" + "---:|" * len(systems)]
    keys = list(dict.fromkeys((r["test_set"], r["noise"], r["snr_db"], r["modality"])
                              for r in sort_rows({**r, "system": ""} for r in rows)))
    table = {(r.get("system", ""), r["test_set"], r["noise"], r["snr_db"], r["modality"]): r["wer"]
             for r in rows}
    for t, noise, snr, mod in keys:
        cells = [table.get((s, t, noise, snr, mod)) for s in systems]
        lines.append(f"| {t} | {noise} | {_fmt_snr(snr)} | {mod} | "
                     + " | ".join("-" if c is None else f"{c:.2f}" for c in cells) + " |")
    return lines + [""]


def format_results_md(rows: list[dict[str, Any]], env: Mapping[str, str], title: str = "Results",
                      extra_md: str = "") -> str:
    """RESULTS.md text: per system and test set a WER table (rows noise/SNR, columns modality) and a detail
    table (errors by type, words, utterances); with several systems (rows with a ``system`` field) first a
    table comparing them; then ``extra_md`` (e.g. cluster quality) and the environment."""
    rows = sort_rows(rows)
    systems = systems_of(rows)
    lines = [f"# {title}", "", "WER (%) per test set, noise condition and input modality.", ""]
    if len(systems) > 1:
        lines += _comparison_md(rows, systems)
    groups = [(s, t) for s in systems
              for t in sorted({r["test_set"] for r in rows if r.get("system", "") == s})]
    for system, test_set in groups:
        sub = [r for r in rows if r["test_set"] == test_set and r.get("system", "") == system]
        mods = [m for m in MODALITIES if any(r["modality"] == m for r in sub)]
        lines += [
            f"## {system + ': ' if system else ''}{test_set}",
            "",
            "| noise | SNR (dB) | " + " | ".join(mods) + " |",
            "|---|---:|" + "---:|" * len(mods),
        ]
        conds = []
        for r in sub:
            if (r["noise"], r["snr_db"]) not in conds:
                conds.append((r["noise"], r["snr_db"]))
        for noise, snr in conds:
            cells = {
                r["modality"]: f"{r['wer']:.2f}" for r in sub if (r["noise"], r["snr_db"]) == (noise, snr)
            }
            lines.append(
                f"| {noise} | {_fmt_snr(snr)} | " + " | ".join(cells.get(m, "-") for m in mods) + " |"
            )
        lines += [
            "",
            "| modality | noise | SNR (dB) | WER (%) | sub | del | ins | words | utts | failed "
            "| audio only |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in sub:
            lines.append(
                f"| {r['modality']} | {r['noise']} | {_fmt_snr(r['snr_db'])} | {r['wer']:.2f} | "
                f"{r.get('sub', '-')} | {r.get('del', '-')} | {r.get('ins', '-')} | {r['num_words']} | "
                f"{r['num_utts']} | {r.get('num_failed', 0)} | {r.get('num_audio_only', 0)} |"
            )
        failed = sum(r.get("num_failed", 0) for r in sub)
        if failed:
            lines += ["", f"**{failed} utterance decodings failed** (listed in the `failed` files of the "
                      "decode directory); each counts as an empty hypothesis, all its words deleted."]
        fallback = sum(r.get("num_audio_only", 0) for r in sub)
        if fallback:
            lines += ["", f"**{fallback} audio-visual utterance decodings used the audio alone**: their "
                      "video could not be used (listed with the reason in the `audio_only` files of the "
                      "decode directory)."]
        lines.append("")
    if extra_md.strip():
        lines += [extra_md.strip(), ""]
    lines += ["## Environment", ""]
    lines += [f"- {k}: {v}" for k, v in env.items()]
    return "\n".join(lines) + "\n"


def plot_wer_vs_snr(rows: list[dict[str, Any]], path: str | os.PathLike) -> None:
    """Plot WER (%) against SNR (dB): one panel per test set, one line per modality and noise type; the
    clean condition is drawn as a separate point at the right, on an x tick labelled ``clean``, and as a
    dotted level across the panel. Written atomically as PNG (matplotlib Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = sort_rows(rows)
    systems = systems_of(rows)
    styles = ["-", "--", "-.", ":"]
    test_sets = sorted({r["test_set"] for r in rows})
    fig, axes = plt.subplots(1, len(test_sets), figsize=(5.5 * len(test_sets), 4.2), squeeze=False)
    colors = {"audio": "tab:blue", "video": "tab:orange", "audiovisual": "tab:green"}
    markers = ["o", "^", "v", "D", "P", "X"]
    for ax, test_set in zip(axes[0], test_sets):
        sub = [r for r in rows if r["test_set"] == test_set]
        snrs = sorted({r["snr_db"] for r in sub if r["snr_db"] is not None})
        span = (snrs[-1] - snrs[0]) if len(snrs) > 1 else 10.0
        x_clean = (snrs[-1] + max(span / 4, 2.5)) if snrs else 0.0
        noises = sorted({r["noise"] for r in sub if r["noise"] != "clean"})
        for k, system in enumerate(systems):
            tag = f"{system}: " if system else ""
            for mod in MODALITIES:
                mine = [r for r in sub if r["modality"] == mod and r.get("system", "") == system]
                for j, noise in enumerate(noises):
                    pts = [(r["snr_db"], r["wer"]) for r in mine if r["noise"] == noise]
                    if pts:
                        ax.plot(
                            *zip(*pts),
                            marker=markers[j % len(markers)],
                            linestyle=styles[k % len(styles)],
                            color=colors[mod],
                            label=f"{tag}{mod} ({noise})",
                        )
                clean = [r["wer"] for r in mine if r["noise"] == "clean"]
                if clean:
                    if len(systems) == 1:
                        ax.axhline(clean[0], color=colors[mod], linestyle=":", linewidth=1)
                    ax.plot(
                        [x_clean],
                        clean[:1],
                        marker="s" if k == 0 else "D",
                        linestyle="none",
                        color=colors[mod],
                        label=f"{tag}{mod} (clean)",
                    )
        ticks = list(snrs) + ([x_clean] if any(r["noise"] == "clean" for r in sub) else [])
        ax.set_xticks(ticks, [f"{s:g}" for s in snrs] + (["clean"] if len(ticks) > len(snrs) else []))
        ax.set_xlabel("SNR (dB)")
        ax.set_ylabel("WER (%)")
        ax.set_title(test_set)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    try:
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png", dpi=100)
    finally:
        plt.close(fig)


def write_results(
    exp_dir: str | os.PathLike, rows: Iterable[Mapping[str, Any]], notes: str = "", title: str = "Results",
    extra_md: str = "",
) -> Path:
    """Write ``results.json``, ``RESULTS.md`` and ``wer_vs_snr.png`` into ``exp_dir`` (created if needed).

    Args:
        exp_dir: output directory.
        rows: results rows with at least ``test_set, modality, noise, snr_db, wer, num_words, num_utts``
            (extra fields such as ``sub/del/ins`` are kept in the JSON).
        notes: free text for the environment section of RESULTS.md (model, checkpoint, decode options...).
        title: heading of RESULTS.md.
        extra_md: markdown placed before the environment section (e.g. cluster quality tables).

    Returns:
        The path of ``results.json``.

    Raises:
        ScoringError: a row lacks a required key, has an unknown modality, or has ``snr_db`` null for a
            noisy condition (or not null for clean).
    """
    rows = [dict(r) for r in rows]
    _check_rows(rows)
    rows = sort_rows(rows)
    exp_dir = Path(exp_dir)
    exp_dir.mkdir(parents=True, exist_ok=True)
    out = exp_dir / "results.json"
    write_text_atomic(out, json.dumps(rows, indent=2) + "\n")
    md = format_results_md(rows, environment_info(notes), title, extra_md)
    write_text_atomic(exp_dir / "RESULTS.md", md)
    plot_wer_vs_snr(rows, exp_dir / "wer_vs_snr.png")
    return out
