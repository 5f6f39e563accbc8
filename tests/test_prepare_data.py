"""prepare_data checks every utterance: bad ones are listed with their reason in bad_utts and left out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from avsr.bin.prepare_data import main as prepare_data
from avsr.data.datadir import read_datadir, read_kaldi_map
from avsr.data.media import write_video, write_wav


def _utt(root: Path, name: str, frames: int = 20, size: int = 96, fps: int = 25, text: str = "BIN BLUE",
         samples: int | None = None) -> Path:
    stem = root / "test" / "spk" / name
    stem.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(len(name))
    write_video(stem.with_suffix(".mp4"), rng.integers(0, 255, (frames, size, size), dtype=np.uint8), fps=fps)
    write_wav(stem.with_suffix(".wav"), torch.from_numpy(rng.normal(0, 0.1, samples or frames * 640)).float())
    stem.with_suffix(".txt").write_text(text + "\n")
    return stem


@pytest.fixture()
def corpus(tmp_path):
    root = tmp_path / "corpus"
    _utt(root, "spk_good")
    _utt(root, "spk_good2", frames=30)
    stem = _utt(root, "spk_8k")  # an 8 kHz wav of the right duration
    sf.write(stem.with_suffix(".wav"), np.random.default_rng(1).normal(0, 0.1, 20 * 320), 8000)
    stem = _utt(root, "spk_stereo")
    sf.write(stem.with_suffix(".wav"), np.random.default_rng(2).normal(0, 0.1, (20 * 640, 2)), 16000)
    stem = _utt(root, "spk_nan")
    wav = np.random.default_rng(3).normal(0, 0.1, 20 * 640).astype(np.float32)
    wav[100] = np.nan
    sf.write(stem.with_suffix(".wav"), wav, 16000, subtype="FLOAT")
    stem = _utt(root, "spk_trunc", frames=50)
    data = stem.with_suffix(".mp4").read_bytes()
    stem.with_suffix(".mp4").write_bytes(data[: len(data) // 2])
    _utt(root, "spk_small", size=64)
    _utt(root, "spk_30fps", fps=30)
    _utt(root, "spk_long_audio", samples=40 * 640)
    _utt(root, "spk_empty", text=" ")
    _utt(root, "spk_nomp4").with_suffix(".mp4").unlink()
    return root


EXPECTED = {
    "spk_8k": "8000 Hz, 1 channel(s); 16000 Hz mono expected",
    "spk_stereo": "16000 Hz, 2 channel(s)",
    "spk_nan": "NaN or infinite samples",
    "spk_trunc": "spk_trunc.mp4",
    "spk_small": "64x64 pixels, 96x96 expected",
    "spk_30fps": "30 fps, 25 fps expected",
    "spk_long_audio": "lasts 1.600 s (40.0 frames) but video",
    "spk_empty": "empty transcript",
    "spk_nomp4": "spk_nomp4.mp4 missing",
}


def test_bad_utterances_are_listed_with_their_reason_and_left_out(corpus, tmp_path, capsys):
    out = tmp_path / "data"
    assert prepare_data(["--corpus", str(corpus), "--out", str(out), "--splits", "test", "--nj", "2",
                         "--no-progress"]) == 0
    assert [u.utt_id for u in read_datadir(out / "test")] == ["spk_good", "spk_good2"]
    bad = read_kaldi_map(out / "test" / "bad_utts")
    assert sorted(bad) == sorted(EXPECTED)
    for utt_id, reason in EXPECTED.items():
        assert reason in bad[utt_id], (utt_id, bad[utt_id])
    assert "cannot read video file" in bad["spk_trunc"] or "(truncated?)" in bad["spk_trunc"]
    assert "2 utterances, 9 bad" in capsys.readouterr().out


def test_strict_makes_a_bad_utterance_an_error(corpus, tmp_path, capsys):
    status = prepare_data(["--corpus", str(corpus), "--out", str(tmp_path / "d"), "--splits", "test",
                           "--strict", "--nj", "1", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert status == 1 and len(err.splitlines()) == 1
    assert err.startswith("avsr-prepare-data: error:") and "9 bad utterance(s)" in err and "spk_" in err


def test_resample_audio_writes_16k_mono_copies(corpus, tmp_path):
    out = tmp_path / "data"
    assert prepare_data(["--corpus", str(corpus), "--out", str(out), "--splits", "test", "--resample-audio",
                         "--nj", "1", "--no-progress"]) == 0
    utts = {u.utt_id: u for u in read_datadir(out / "test")}
    assert sorted(utts) == ["spk_8k", "spk_good", "spk_good2", "spk_stereo"]
    for name in ("spk_8k", "spk_stereo"):
        info = sf.info(utts[name].wav)
        assert (info.samplerate, info.channels) == (16000, 1) and "audio_16k" in utts[name].wav
        assert abs(info.frames - 20 * 640) <= 2
