"""Where a SynthGRID model errs: per GRID slot, per letter, per voice.

Every SynthGRID reference has the six slots of the grammar (``command colour preposition letter digit
adverb``). A word-level Levenshtein alignment of hypothesis and reference (jiwer's ``process_words``, the
alignment the WER uses) gives each reference word an outcome -- correct, substituted or deleted -- and so
the error rate of each slot; insertions belong to no slot and are counted apart. The letter slot, where
nearly all errors are, also gets its confusion pairs, and the voices (from the corpus' ``speakers.json``)
their own WER.

Reads the decode-dir layout of :mod:`avsr.eval.scoring` (``<test_set>/<modality>/<condition>/{hyp,ref}``).
:func:`report_markdown` writes the tables for ``RESULTS.md`` (``python -m avsr.bin.synthgrid_report``, run
by the recipe's scoring stage).
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import jiwer

from avsr.corpora.synthgrid.engines import voice_key
from avsr.eval.scoring import HYP_NAMES, REF_NAMES, parse_condition, read_transcripts
from avsr.modalities import MODALITIES

#: names of the six slots, in sentence order
SLOT_NAMES = ("command", "colour", "preposition", "letter", "digit", "adverb")
LETTER_SLOT = 3


@dataclass
class SlotErrors:
    """Outcome counts of one set of utterances.

    Attributes:
        words: reference words per slot.  errors: substituted or deleted reference words per slot.
        insertions: inserted words (no slot).  utts: utterances.
        letters: (reference letter, hypothesis word or ``<del>``) -> count, for letter-slot errors.
    """

    words: list[int] = field(default_factory=lambda: [0] * len(SLOT_NAMES))
    errors: list[int] = field(default_factory=lambda: [0] * len(SLOT_NAMES))
    insertions: int = 0
    utts: int = 0
    letters: Counter = field(default_factory=Counter)

    def rate(self, slot: int) -> float:
        """Error rate of a slot in percent (nan without words)."""
        return 100.0 * self.errors[slot] / self.words[slot] if self.words[slot] else float("nan")

    @property
    def wer(self) -> float:
        """Word error rate in percent (substitutions, deletions and insertions over reference words)."""
        total = sum(self.words)
        return 100.0 * (sum(self.errors) + self.insertions) / total if total else float("nan")


def slot_errors(
    refs: Mapping[str, str], hyps: Mapping[str, str], utts: list[str] | None = None
) -> SlotErrors:
    """Align each hypothesis to its reference and count errors per slot.

    Args:
        refs, hyps: utt-id -> words (a missing hypothesis counts as empty).
        utts: the utterances to count (default: every reference).

    Returns:
        the counts. A reference that is not a six-word GRID sentence counts its words in the slot of their
        position, the extra ones in the last slot.
    """
    out = SlotErrors()
    ids = sorted(refs) if utts is None else sorted(utts)
    if not ids:
        return out
    refs_l = [refs[u] for u in ids]
    hyps_l = [hyps.get(u, "") for u in ids]
    # jiwer refuses empty references; GRID references never are
    aligned = jiwer.process_words(refs_l, [h if h.strip() else "<empty>" for h in hyps_l])
    for ref, hyp, chunks in zip(aligned.references, aligned.hypotheses, aligned.alignments):
        out.utts += 1
        empty = hyp == ["<empty>"]
        for i in range(len(ref)):
            out.words[min(i, len(SLOT_NAMES) - 1)] += 1
        for chunk in chunks:
            if chunk.type == "insert":
                out.insertions += 0 if empty else chunk.hyp_end_idx - chunk.hyp_start_idx
                continue
            for k, i in enumerate(range(chunk.ref_start_idx, chunk.ref_end_idx)):
                slot = min(i, len(SLOT_NAMES) - 1)
                wrong = chunk.type != "equal" or empty
                if not wrong:
                    continue
                out.errors[slot] += 1
                if slot == LETTER_SLOT:
                    said = "<del>" if chunk.type == "delete" or empty else hyp[chunk.hyp_start_idx + k]
                    out.letters[(ref[i], said)] += 1
    return out


def read_condition(cond_dir: str | os.PathLike) -> tuple[dict[str, str], dict[str, str]]:
    """References and hypotheses of a decode condition directory (failed utterances: empty hypotheses)."""
    cond_dir = Path(cond_dir)
    hyp = next(cond_dir / n for n in HYP_NAMES if (cond_dir / n).is_file())
    ref = next(cond_dir / n for n in REF_NAMES if (cond_dir / n).is_file())
    hyps = read_transcripts(hyp)
    if (cond_dir / "failed").is_file():
        hyps.update(dict.fromkeys(read_transcripts(cond_dir / "failed"), ""))
    return read_transcripts(ref), hyps


def collect(decode_dir: str | os.PathLike) -> dict[tuple[str, str, str], tuple[dict, dict]]:
    """``(test_set, modality, condition) -> (refs, hyps)`` for every condition of a decode dir."""
    out = {}
    for test_dir in sorted(p for p in Path(decode_dir).iterdir() if p.is_dir()):
        for mod_dir in sorted(p for p in test_dir.iterdir() if p.is_dir() and p.name in MODALITIES):
            for cond_dir in sorted(p for p in mod_dir.iterdir() if p.is_dir()):
                if any((cond_dir / n).is_file() for n in HYP_NAMES):
                    out[(test_dir.name, mod_dir.name, cond_dir.name)] = read_condition(cond_dir)
    return out


def speaker_voices(corpus_dir: str | os.PathLike) -> dict[str, str]:
    """speaker id -> voice key, from the corpus' ``speakers.json`` (empty if there is none): festival's voice
    name, ``espeak-ng:<accent>[+<variant>]`` or ``flite:<voice>``
    (:func:`avsr.corpora.synthgrid.engines.voice_key`)."""
    path = Path(corpus_dir) / "speakers.json"
    if not path.is_file():
        return {}
    return {spk: voice_key(info.get("engine", "festival"), info["voice"], info.get("variant"))
            for spk, info in json.loads(path.read_text()).items()}


def _condition_key(cond: str) -> tuple:
    noise, snr = parse_condition(cond)
    return (noise != "clean", noise, -1e9 if snr is None else -snr)


def _fmt(x: float) -> str:
    return "-" if x != x else f"{x:.1f}"


def report_markdown(decode_dir: str | os.PathLike, corpus_dir: str | os.PathLike | None = None,
                    top_confusions: int = 10) -> str:
    """The SynthGRID tables for ``RESULTS.md``.

    Sections: error rate (%) per slot for every test set x condition x modality; the most frequent letter
    confusions of the clean condition per modality; with ``corpus_dir``, the WER per voice of each test set
    (clean, every modality).

    Raises:
        ScoringError: unreadable transcripts (as :mod:`avsr.eval.scoring`).
        StopIteration: a condition directory without hypothesis or reference file.
    """
    data = collect(decode_dir)
    lines = ["## SynthGRID: errors per slot", "",
             "Error rate (%) of each GRID slot: substituted or deleted reference words of the slot over its "
             "words (word-level alignment as for the WER); insertions are counted apart.", "",
             "| test set | condition | modality | " + " | ".join(SLOT_NAMES) + " | insertions | WER |",
             "|---|---|---|" + "---:|" * (len(SLOT_NAMES) + 2)]
    keys = sorted(data, key=lambda k: (k[0], _condition_key(k[2]), MODALITIES.index(k[1])))
    stats = {k: slot_errors(*data[k]) for k in keys}
    for k in keys:
        s = stats[k]
        rates = " | ".join(_fmt(s.rate(i)) for i in range(len(SLOT_NAMES)))
        lines.append(f"| {k[0]} | {k[2]} | {k[1]} | {rates} | {s.insertions} | {_fmt(s.wer)} |")
    lines += ["", "## SynthGRID: letter confusions (clean)", "",
              f"The {top_confusions} most frequent letter-slot errors (reference -> hypothesis, count) of "
              "each modality.", "",
              "| test set | modality | letter errors | confusions |", "|---|---|---:|---|"]
    for k in keys:
        if k[2] != "clean":
            continue
        s = stats[k]
        pairs = ", ".join(f"{a}->{b} {n}" for (a, b), n in s.letters.most_common(top_confusions))
        lines.append(f"| {k[0]} | {k[1]} | {s.errors[LETTER_SLOT]} | {pairs or '-'} |")
    voices = speaker_voices(corpus_dir) if corpus_dir is not None else {}
    if voices:
        lines += ["", "## SynthGRID: WER per voice (clean)", "",
                  "WER (%) of the utterances of each voice (speakers: the corpus' speakers.json).",
                  ""]
        for test_set in sorted({k[0] for k in keys}):
            mods = [m for m in MODALITIES if (test_set, m, "clean") in data]
            if not mods:
                continue
            refs = data[(test_set, mods[0], "clean")][0]
            by_voice: dict[str, list[str]] = {}
            for u in refs:
                by_voice.setdefault(voices.get(u.split("_", 1)[0], "?"), []).append(u)
            lines += [f"{test_set}:", "", "| voice | utts | " + " | ".join(mods) + " |",
                      "|---|---:|" + "---:|" * len(mods)]
            for voice, utts in sorted(by_voice.items()):
                wers = [slot_errors(*data[(test_set, m, "clean")], utts=utts).wer for m in mods]
                lines.append(f"| {voice} | {len(utts)} | " + " | ".join(_fmt(w) for w in wers) + " |")
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"

