"""SynthGRID error tables: errors per GRID slot, letter confusions, WER per voice."""

from __future__ import annotations

import json

import pytest

from avsr.corpora.synthgrid.slots import LETTER_SLOT, SLOT_NAMES, report_markdown, slot_errors

REFS = {
    "tr000_bbaf2n_0000": "BIN BLUE AT F TWO NOW",
    "tr001_lgbb0a_0000": "LAY GREEN BY B ZERO AGAIN",
    "tr000_srip5s_0001": "SET RED IN P FIVE SOON",
}


def test_slot_errors_attribute_substitutions_and_deletions_to_slots():
    hyps = {
        "tr000_bbaf2n_0000": "BIN BLUE AT S TWO NOW",       # letter substituted
        "tr001_lgbb0a_0000": "LAY GREEN BY ZERO AGAIN",      # letter deleted
        "tr000_srip5s_0001": "SET RED IN P P FIVE SOON",     # an insertion
    }  # fmt: skip
    s = slot_errors(REFS, hyps)
    assert s.words == [3] * 6 and s.utts == 3
    assert s.errors == [0, 0, 0, 2, 0, 0] and s.insertions == 1
    assert s.rate(LETTER_SLOT) == pytest.approx(200 / 3) and s.rate(0) == 0.0
    assert s.wer == pytest.approx(100 * 3 / 18)
    assert s.letters == {("F", "S"): 1, ("B", "<del>"): 1}


def test_slot_errors_count_an_empty_or_missing_hypothesis_as_all_deleted():
    s = slot_errors(REFS, {"tr000_bbaf2n_0000": ""}, utts=["tr000_bbaf2n_0000", "tr001_lgbb0a_0000"])
    assert s.errors == [2] * 6 and s.insertions == 0 and s.wer == pytest.approx(100.0)
    assert s.letters == {("F", "<del>"): 1, ("B", "<del>"): 1}


def test_report_has_slot_letter_and_voice_tables(tmp_path):
    decode = tmp_path / "decode"
    for test_set, modality, cond, hyp in (
        ("test", "audio", "clean", {"tr000_bbaf2n_0000": "BIN BLUE AT S TWO NOW"}),
        ("test", "audiovisual", "clean", {}),
        ("test", "audio", "babble_-5", {"tr001_lgbb0a_0000": "LAY GREEN BY D ZERO AGAIN"}),
    ):
        d = decode / test_set / modality / cond
        d.mkdir(parents=True)
        (d / "ref").write_text("".join(f"{u} {w}\n" for u, w in REFS.items()))
        (d / "hyp").write_text("".join(f"{u} {hyp.get(u, w)}\n" for u, w in REFS.items()))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "speakers.json").write_text(json.dumps({
        "tr000": {"voice": "kal_diphone"},
        "tr001": {"voice": "en-gb-x-rp", "engine": "espeak-ng", "variant": "iven3"}}))
    md = report_markdown(decode, corpus)
    assert "| test | clean | audio | 0.0 | 0.0 | 0.0 | 33.3 | 0.0 | 0.0 | 0 | 5.6 |" in md
    assert "| test | babble_-5 | audio |" in md and md.index("clean | audiovisual") < md.index("babble_-5")
    assert "| test | audio | 1 | F->S 1 |" in md and "| test | audiovisual | 0 | - |" in md
    assert "| kal_diphone | 2 | 8.3 | 0.0 |" in md and "| espeak-ng:en-gb-x-rp+iven3 | 1 | 0.0 | 0.0 |" in md
    assert all(name in md for name in SLOT_NAMES)
