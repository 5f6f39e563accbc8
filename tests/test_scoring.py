"""WER scoring, decode-dir collection, results files and the avsr.bin.score CLI."""

import json
import subprocess
import sys

import pytest

from avsr.bin import score as score_cli
from avsr.eval.scoring import (
    ScoringError,
    collect_decode_dir,
    parse_condition,
    read_transcripts,
    word_errors,
    write_results,
)

REF = {"s1_a": "BIN BLUE AT F TWO NOW", "s1_b": "LAY RED BY G", "s2_c": ""}
HYP = {
    "s1_a": "BIN BLUE AT F TWO",
    "s1_b": "LAY GREEN BY G SOON",
    "s2_c": "NOW",
}  # 1 del, 1 sub + 1 ins, 1 ins


def write_kaldi(path, mapping):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{u} {w}".rstrip() + "\n" for u, w in sorted(mapping.items())))


def make_decode_dir(root, hyp_name="hyp"):
    for test_set in ("test",):
        for mod in ("audio", "video", "audiovisual"):
            for cond in ("clean", "babble_-5", "babble_0", "babble_5"):
                d = root / test_set / mod / cond
                write_kaldi(d / "ref", REF)
                hyp = dict(HYP) if cond != "clean" else dict(REF)
                if mod == "video" and cond == "babble_-5":
                    hyp["s1_a"] = "X Y"
                write_kaldi(d / hyp_name, hyp)
    return root


def test_word_errors_counts_each_type():
    counts = word_errors(REF, HYP)
    assert counts == {"sub": 1, "del": 1, "ins": 2, "num_words": 10, "num_utts": 3}


def test_missing_or_extra_hypothesis_names_the_utterance():
    with pytest.raises(ScoringError, match="s1_b"):
        word_errors(REF, {k: v for k, v in HYP.items() if k != "s1_b"})
    with pytest.raises(ScoringError, match="s9_z"):
        word_errors(REF, {**HYP, "s9_z": "A"})


def test_read_kaldi_and_trn(tmp_path):
    (tmp_path / "text").write_text("u1 A  B\nu2\n\n")
    assert read_transcripts(tmp_path / "text") == {"u1": "A B", "u2": ""}
    (tmp_path / "hyp.trn").write_text("A B (u1)\n (u2)\n")
    assert read_transcripts(tmp_path / "hyp.trn") == {"u1": "A B", "u2": ""}
    (tmp_path / "dup").write_text("u1 A\nu1 B\n")
    with pytest.raises(ScoringError, match="dup:2.*u1"):
        read_transcripts(tmp_path / "dup")
    (tmp_path / "bad.trn").write_text("A B u1\n")
    with pytest.raises(ScoringError, match="bad.trn:1"):
        read_transcripts(tmp_path / "bad.trn")


def test_parse_condition():
    assert parse_condition("clean") == ("clean", None)
    assert parse_condition("babble_-5") == ("babble", -5)
    assert parse_condition("white_noise_2.5") == ("white_noise", 2.5)
    for bad in ("babble", "babble_x", "clean_5", "_5"):
        with pytest.raises(ScoringError, match=bad):
            parse_condition(bad)


def test_collect_and_write_results(tmp_path):
    rows = collect_decode_dir(make_decode_dir(tmp_path / "decode"))
    assert len(rows) == 12
    first = rows[0]
    assert (first["noise"], first["snr_db"], first["modality"], first["wer"]) == ("clean", None, "audio", 0.0)
    vid = [r for r in rows if r["modality"] == "video" and r["snr_db"] == -5][0]
    # s1_a "X Y" vs 6 words: 2 sub + 4 del; s1_b: 1 sub + 1 ins; s2_c: 1 ins -> 9 / 10
    assert vid["wer"] == pytest.approx(90.0) and vid["num_words"] == 10 and vid["num_utts"] == 3
    out = write_results(tmp_path / "exp", rows, notes="tiny test model")
    data = json.loads(out.read_text())
    assert data == rows
    for row in data:
        assert set(row) >= {"test_set", "modality", "noise", "snr_db", "wer", "num_words", "num_utts"}
    md = (tmp_path / "exp" / "RESULTS.md").read_text()
    assert "| noise | SNR (dB) | audio | video | audiovisual |" in md
    assert "| babble | -5 | 40.00 | 90.00 | 40.00 |" in md
    assert "tiny test model" in md and "torch:" in md
    png = (tmp_path / "exp" / "wer_vs_snr.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in (tmp_path / "exp").iterdir() if p.name.startswith(".")]  # no temp files left


def test_decode_dir_errors(tmp_path):
    root = make_decode_dir(tmp_path / "decode")
    (root / "test" / "audio" / "clean" / "hyp").write_text("s1_a BIN\n")
    with pytest.raises(ScoringError, match="s1_b"):
        collect_decode_dir(root)
    (root / "test" / "audio" / "clean" / "hyp").unlink()
    with pytest.raises(ScoringError, match="clean.*hypothesis file"):
        collect_decode_dir(root)
    write_kaldi(root / "test" / "audio" / "clean" / "hyp", REF)
    (root / "test" / "audo").mkdir()
    with pytest.raises(ScoringError, match="audo"):
        collect_decode_dir(root)
    with pytest.raises(ScoringError, match="snr_db"):
        write_results(
            tmp_path / "x",
            [
                {
                    "test_set": "t",
                    "modality": "audio",
                    "noise": "babble",
                    "snr_db": None,
                    "wer": 1.0,
                    "num_words": 1,
                    "num_utts": 1,
                }
            ],
        )


def test_cli_prints_results_path_last(tmp_path, capsys):
    root = make_decode_dir(tmp_path / "decode", hyp_name="text")
    assert score_cli.main(["--decode-dir", str(root), "--out", str(tmp_path / "exp")]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == str(tmp_path / "exp" / "results.json")
    assert score_cli.main(["--decode-dir", str(tmp_path / "nope"), "--out", str(tmp_path / "exp")]) == 1
    assert "nope" in capsys.readouterr().err


def test_cli_module_entry_point(tmp_path):
    root = make_decode_dir(tmp_path / "decode")
    res = subprocess.run(
        [sys.executable, "-m", "avsr.bin.score", "--decode-dir", str(root), "--out", str(tmp_path / "exp")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert res.stdout.strip().splitlines()[-1].endswith("results.json")


def test_audio_visual_utterances_decoded_from_their_audio_alone_are_counted(tmp_path):
    decode = make_decode_dir(tmp_path / "decode")
    (decode / "test" / "audiovisual" / "babble_0" / "audio_only").write_text("s1_b video has 1 frame(s)\n")
    rows = collect_decode_dir(decode)
    counted = {(r["modality"], r["snr_db"]): r["num_audio_only"] for r in rows}
    assert counted[("audiovisual", 0)] == 1 and sum(counted.values()) == 1
    write_results(tmp_path / "exp", rows)
    md = (tmp_path / "exp" / "RESULTS.md").read_text()
    assert "**1 audio-visual utterance decodings used the audio alone**" in md
    assert "| audiovisual | babble | 0 | 40.00 | 1 | 1 | 2 | 10 | 3 | 0 | 1 |" in md
