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
    _utt(root, "spk_latin1").with_suffix(".txt").write_bytes("BIN BL\u00c9 AT\n".encode("latin-1"))
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
    "spk_latin1": "spk_latin1.txt: transcript is not UTF-8 text (byte 0xc9 at byte 7)",
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
    assert "2 utterances, 10 bad" in capsys.readouterr().out


def test_strict_makes_a_bad_utterance_an_error(corpus, tmp_path, capsys):
    status = prepare_data(["--corpus", str(corpus), "--out", str(tmp_path / "d"), "--splits", "test",
                           "--strict", "--nj", "1", "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert status == 1 and len(err.splitlines()) == 1
    assert err.startswith("avsr-prepare-data: error:") and "10 bad utterance(s)" in err and "spk_" in err


def test_a_data_dir_file_that_is_not_utf8_is_refused_naming_the_line_and_utterance(tmp_path):
    from avsr.data.datadir import DataDirError

    path = tmp_path / "text"
    path.write_bytes("spk-a BIN BLUE\nspk-b LAY R\u00c9D\n".encode("latin-1"))
    with pytest.raises(DataDirError) as err:
        read_kaldi_map(path)
    message = str(err.value)
    assert message.startswith(f"{path}:2: utterance 'spk-b' is not UTF-8 text (byte 0xc9"), message
    path.write_text("spk-a BIN BLUE\nspk-b LAY R\u00c9D\n", encoding="utf-8")  # as UTF-8 it is read
    assert read_kaldi_map(path)["spk-b"] == "LAY R\u00c9D"


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


def test_edge_test_cuts_or_pads_each_end_reproducibly_and_resumes(tmp_path):
    """avsr.bin.edge_sets: each end is cut to the speech (every silent frame) or 10-25 frames longer, audio
    and video together; the choices are a function of the seed and utterance id; a rerun keeps the media, a
    rerun with other options makes them anew."""
    from avsr.bin.edge_sets import main as edge_test
    from avsr.data.datadir import Utterance, write_datadir
    from avsr.data.media import read_video, read_wav

    rng = np.random.default_rng(0)
    utts = []
    for i in range(8):
        quiet = rng.normal(0, 1e-4, 640 * (3 + i % 2)).astype(np.float32)
        speech = rng.normal(0, 0.3, 640 * 12).astype(np.float32)
        wav = np.concatenate([quiet, speech, quiet[: 640 * 2]])
        frames = wav.size // 640
        stem = tmp_path / "src" / f"spk_u{i}"
        stem.parent.mkdir(parents=True, exist_ok=True)
        write_wav(stem.with_suffix(".wav"), wav)
        write_video(stem.with_suffix(".mp4"), np.repeat(np.arange(frames, dtype=np.uint8)[:, None, None] * 12,
                                                        96, 1).repeat(96, 2))
        utts.append(Utterance(f"spk_u{i}", "spk", str(stem.with_suffix(".wav")),
                              str(stem.with_suffix(".mp4")), "BIN BLUE", frames))
    write_datadir(tmp_path / "test", utts)
    dst = tmp_path / "test_edges"
    assert edge_test(["--src", str(tmp_path / "test"), "--dst", str(dst), "--no-progress"]) in (0, None)
    edges = read_kaldi_map(dst / "edges")
    out = {u.utt_id: u for u in read_datadir(dst)}
    assert set(out) == set(edges) == {u.utt_id for u in utts}
    kinds = set()
    for u in utts:
        start, end = map(int, edges[u.utt_id].split())
        silent = (3 + int(u.utt_id[-1]) % 2, 2)
        assert start in (-silent[0], *range(10, 26)) and end in (-silent[1], *range(10, 26))
        kinds.update((start < 0, end < 0))
        wav, video = read_wav(out[u.utt_id].wav), read_video(out[u.utt_id].video)
        assert video.shape[0] == u.num_frames + start + end == out[u.utt_id].num_frames
        assert wav.numel() == 640 * video.shape[0]
        shown = (video[:, 48, 48].float() / 12).round().long()  # frame k shows source frame shown[k]
        first = max(0, -start)
        assert shown[max(0, start)] == first and shown[0] == first  # the first kept frame, repeated if padded
        assert float(wav[: 640 * max(0, start)].abs().sum()) < 0.01 * 640 * max(0, start) + 1e-9  # quiet
    assert kinds == {True, False}  # both cuts and pads were drawn
    mtime = (dst / "media" / "spk_u0.wav").stat().st_mtime_ns
    args = ["--src", str(tmp_path / "test"), "--dst", str(dst), "--no-progress"]
    assert edge_test(args) in (0, None)
    assert (dst / "media" / "spk_u0.wav").stat().st_mtime_ns == mtime
    assert read_kaldi_map(dst / "edges") == edges
    assert edge_test([*args, "--seed", "3"]) in (0, None)
    assert read_kaldi_map(dst / "edges") != edges  # other draws, media made anew
    for u in read_datadir(dst):
        assert read_video(u.video).shape[0] == u.num_frames
    assert edge_test(["--src", str(tmp_path / "test"), "--dst", str(dst), "--pad-frames", "5", "2"]) == 2
