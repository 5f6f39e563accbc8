"""The LRS3 recipe: corpus preparation as AV-HuBERT's, the paper's configurations, and every stage end to end.

The end-to-end test builds an LRS3-shaped directory from SynthGRID utterances written as full-frame face
videos (the astronaut speaking the rendered mouth: the ROI stage must find the mouth), with LRS3's
``Text:  ...`` transcripts and ``pretrain`` word timings, and a MUSAN-layout noise directory; then it runs
``recipes/lrs3/avsr1/run.sh`` with a tiny model and checks what every stage wrote.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from avsr.data.lrs3 import (
    LRS3Error,
    LRS3Utterance,
    choose_valid,
    make_splits,
    read_transcript,
    read_word_timings,
    scan_part,
    split_long_clip,
    write_corpus,
)

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "lrs3" / "avsr1"
SPEAKERS = {"tr000": "0aB_x-YZ12k", "tr001": "K9-_qq3LmN0", "tr002": "zz_Top-1234", "te000": "Tst-spk_001"}


# --- LRS3 files and splits ---------------------------------------------------------------------------


def _clip(root: Path, part: str, spk: str, clip: str, text: str, words=None) -> None:
    d = root / part / spk
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{clip}.mp4").write_bytes(b"")
    lines = [f"Text:  {text}", "Conf:  3", ""]
    if words is not None:
        lines += ["WORD START END ASDSCORE"] + [f"{w} {s:.2f} {e:.2f} 1.0" for w, s, e in words]
    (d / f"{clip}.txt").write_text("\n".join(lines) + "\n")


def test_transcripts_and_word_timings_are_read_and_checked(tmp_path):
    _clip(tmp_path, "pretrain", "s", "00001", "so  what  {LG} ok", [("SO", 0.1, 0.3), ("WHAT", 0.35, 0.6)])
    txt = tmp_path / "pretrain" / "s" / "00001.txt"
    assert read_transcript(txt) == "SO WHAT {LG} OK"
    assert read_word_timings(txt) == [("SO", 0.1, 0.3), ("WHAT", 0.35, 0.6)]
    txt.write_text("Txet:  A\n")
    with pytest.raises(LRS3Error, match=r"00001.txt: line 1 must start with 'Text:'"):
        read_transcript(txt)
    txt.write_text("Text:  A\n\nWORD START END ASDSCORE\nA 0.1 x 1.0\n")
    with pytest.raises(LRS3Error, match=r"00001.txt:4: expected 'WORD START END SCORE'"):
        read_word_timings(txt)


def test_long_pretrain_clips_are_cut_at_pauses_as_avhubert():
    words = [("A", 0.0, 5.0), ("B", 5.2, 7.0), ("C", 8.0, 12.0), ("D", 12.3, 16.0)]
    # pauses: 0.2 (kept), 1.0 (cut), 0.3 (kept) -> "A B" | "C D"
    assert split_long_clip(words) == [("A B", 0.0, 7.5), ("C D", 7.5, None)]
    assert split_long_clip(words[:3]) is None  # last word ends before 15 s: whole clip
    assert split_long_clip([("A", 0.0, 16.0)]) == [("A", 0.0, None)]


def _lrs3_tree(root: Path) -> None:
    long_words = [("A", 0.0, 5.0), ("B", 6.0, 16.0)]
    for spk in ("s1", "s2"):
        _clip(root, "pretrain", spk, "00001", "A B", long_words)
        _clip(root, "pretrain", spk, "00002", "C", [("C", 0.1, 0.5)])
        for k in range(3):
            _clip(root, "trainval", spk, f"5000{k}", f"T {spk} {k}")
    _clip(root, "test", "t1", "00001", "X Y")


def test_splits_follow_avhubert_lrs3_manifest(tmp_path):
    _lrs3_tree(tmp_path)
    utts = {part: scan_part(tmp_path, part) for part in ("pretrain", "trainval", "test")}
    pre = utts["pretrain"]
    assert [u.utt_id for u in pre] == [
        "s1_00001_0",
        "s1_00001_1",
        "s1_00002",
        "s2_00001_0",
        "s2_00001_1",
        "s2_00002",
    ]
    assert (pre[0].text, pre[0].start, pre[0].end, pre[0].duration) == ("A", 0.0, 5.5, 5.5)
    assert (pre[1].original_id, pre[1].end, pre[1].duration) == ("short-pretrain/s1/00001_1", None, 10.5)
    valid = choose_valid(utts["trainval"], ["trainval/s1/50001", "trainval/s2/50002", "trainval/zz/1"])
    assert valid == {"s1_50001", "s2_50002"}
    assert choose_valid(utts["trainval"], None, 2, seed=0) == choose_valid(utts["trainval"], None, 2, seed=0)
    with pytest.raises(LRS3Error, match="num-valid"):
        choose_valid(utts["trainval"], None, 6)
    s30 = make_splits(utts, valid, "30h")
    assert [u.utt_id for u in s30["train"]] == ["s1_50000", "s1_50002", "s2_50000", "s2_50001"]
    assert [len(s30[k]) for k in ("valid", "test")] == [2, 1] and "pretrain_all" not in s30
    s433 = make_splits(utts, valid, "433h", max_seconds=10.0)  # the 10.5 s pieces are left out
    assert len(s433["train"]) == 4 + 4
    both = make_splits(utts, valid, "30h", include_pretrain=True)
    assert len(both["train"]) == 4 and len(both["pretrain_all"]) == 10
    with pytest.raises(LRS3Error, match="pretrain directory"):
        make_splits({k: v for k, v in utts.items() if k != "pretrain"}, valid, "433h")

    lines = write_corpus(both, tmp_path / "corpus")
    assert (tmp_path / "corpus/train/s1/s1_50000.txt").read_text() == "T S1 0\n"
    link = tmp_path / "corpus/pretrain_all/s1/s1_50000.mp4"
    assert link.is_symlink() and link.resolve() == (tmp_path / "corpus/train/s1/s1_50000.mp4").resolve()
    assert len(lines) == 4 + 2 + 1 + 6  # train, valid, test, and the pretrain utterances (once each)
    cut = [line for line in lines if "pretrain_all/s1/s1_00001_1.mp4" in line]
    assert cut == [
        f"{(tmp_path / 'pretrain/s1/00001.mp4').resolve()} pretrain_all/s1/s1_00001_1.mp4 5.500 -1.000"
    ]


def test_utterance_ids_keep_the_speaker_prefix():
    u = LRS3Utterance("trainval", "a_b-c", "50001", Path("x.mp4"), "HI")
    assert u.utt_id == "a_b-c_50001" and u.original_id == "trainval/a_b-c/50001" and not u.trimmed


def test_run_sh_checks_its_options():
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin:/usr/local/bin"}

    def run(*a):
        return subprocess.run(["bash", str(RECIPE / "run.sh"), *a], capture_output=True, text=True, env=env)

    proc = run("--help")
    assert proc.returncode == 0 and "--lrs3-root" in proc.stdout and "--noise-types" in proc.stdout
    proc = run("--labeled", "100h")
    assert proc.returncode == 1 and "--labeled must be 30h or 433h" in proc.stderr
    proc = run("--stage")
    assert proc.returncode == 1 and "option --stage needs a value" in proc.stderr


# --- configurations ----------------------------------------------------------------------------------


def _configs() -> list[Path]:
    pt = [p for p in sorted((ROOT / "conf/pretrain").glob("*.yaml")) if "lrs3" in p.name or "vox2" in p.name]
    return pt + sorted((ROOT / "conf/finetune").glob("*.yaml"))


@pytest.mark.parametrize("path", _configs(), ids=lambda p: p.name)
def test_paper_configs_load_and_build(path):
    from avsr.models.asr import AVSRModel
    from avsr.models.pretrain import AVHubertPretrainModel
    from avsr.train.config import load_experiment_config

    experiment = load_experiment_config(path)
    cfg, model_config = experiment.train, experiment.model
    large = "large" in path.name
    with torch.device("meta"):  # architecture and parameter count without allocating the weights
        if model_config.pretraining:
            model = AVHubertPretrainModel.from_config(dataclasses.replace(model_config, num_classes=[2000]))
        else:
            model = AVSRModel.from_config(dataclasses.replace(model_config, vocab_size=1000), str(path))
            assert model.ctc_lo is None and model.decoder is not None  # attention only, as the paper
            assert len(model.decoder.layers) == (9 if large else 6)
    encoder = sum(p.numel() for p in model.encoder.parameters()) / 1e6
    assert encoder == pytest.approx(324.6 if large else 102.6, abs=0.5)
    assert cfg.batch_frames == 1000 and cfg.max_epoch >= 1 and cfg.warmup_steps > 0


def test_base_finetune_config_builds_on_cpu():
    from avsr.models.asr import AVSRModel
    from avsr.train.config import load_experiment_config

    model_config = load_experiment_config(ROOT / "conf/finetune/avhubert_base_30h.yaml").model
    model = AVSRModel.from_config(dataclasses.replace(model_config, vocab_size=1000))
    assert model.encoder.config.encoder_layerdrop == 0.1 and model.encoder.config.modality_dropout == 0.0
    assert model.decoder.output_projection.weight is model.decoder.embed_tokens.weight  # shared, as the paper
    assert model.decoder.embed_scale == 1.0 and model.conf.lsm_weight == 0.1
    decoder = sum(p.numel() for p in model.decoder.parameters()) / 1e6
    assert decoder == pytest.approx(6 * (4 * 768**2 * 2 + 2 * 768 * 3072) / 1e6 + 0.77, abs=0.3)


# --- the whole recipe ------------------------------------------------------------------------------------


def _write_lrs3_fixture(root: Path) -> tuple[Path, Path]:
    """SynthGRID utterances as an LRS3 directory of face videos, and a MUSAN-layout noise directory."""
    from avsr.corpora.synthgrid.generate import SynthGridConfig, generate
    from avsr.data.face_video import write_face_utterance
    from avsr.data.media import read_wav, write_wav

    sg = root / "synthgrid"
    generate(
        sg,
        SynthGridConfig(
            num_train=10, num_valid=0, num_test=3, train_speakers=3, test_speakers=1, babble_seconds=0
        ),
        nj=1,
        progress=False,
    )
    lrs3 = root / "lrs3"
    train = sorted((sg / "train").glob("*/*.mp4"))
    counters: dict[tuple[str, str], int] = {}
    jobs = [("pretrain" if i < 4 else "trainval", roi) for i, roi in enumerate(train)]
    jobs += [("test", roi) for roi in sorted((sg / "test").glob("*/*.mp4"))]
    for i, (part, roi) in enumerate(jobs):
        spk = SPEAKERS[roi.parent.name]
        n = counters[(part, spk)] = counters.get((part, spk), 0) + 1
        clip = f"{n + (50000 if part == 'trainval' else 0):05d}"
        d = lrs3 / part / spk
        d.mkdir(parents=True, exist_ok=True)
        write_face_utterance(roi, roi.with_suffix(".wav"), d / f"{clip}.mp4", seed=i)
        words = roi.with_suffix(".txt").read_text().split()
        lines = [f"Text:  {' '.join(words)}", "Conf:  4", ""]
        if part == "pretrain":  # word timings spread over the utterance
            seconds = read_wav(roi.with_suffix(".wav")).numel() / 16000
            edges = np.linspace(0.1, seconds - 0.1, len(words) + 1)
            lines += ["WORD START END ASDSCORE"] + [
                f"{w} {a:.2f} {b - 0.02:.2f} 2.5" for w, a, b in zip(words, edges[:-1], edges[1:])
            ]
        (d / f"{clip}.txt").write_text("\n".join(lines) + "\n")

    musan = root / "musan"
    rng = np.random.default_rng(0)
    speech = [read_wav(p) for p in sorted((sg / "train").glob("*/*.wav"))]
    n = min(s.numel() for s in speech)
    t = torch.arange(3 * 16000) / 16000
    files = {
        "babble/b-1.wav": (sum(s[:n] for s in speech[:5]) / 5, 16000),
        "babble/b-2.wav": (sum(s[:n] for s in speech[5:]) / 5, 16000),
        "music/fma/m-1.wav": (0.3 * torch.sin(2 * torch.pi * 440 * t[::2]), 8000),  # 8 kHz: resampled
        "music/fma/m-2.wav": (0.3 * torch.sin(2 * torch.pi * 330 * t), 16000),
        "noise/free-sound/n-1.wav": (torch.from_numpy(rng.normal(0, 0.1, 48000)).float(), 16000),
        "noise/free-sound/n-2.wav": (torch.from_numpy(rng.uniform(-0.2, 0.2, 48000)).float(), 16000),
    }
    for name, (wav, rate) in files.items():
        (musan / name).parent.mkdir(parents=True, exist_ok=True)
        write_wav(musan / name, wav, sample_rate=rate)
    return lrs3, musan


needs_tools = pytest.mark.skipif(
    importlib.util.find_spec("mediapipe") is None
    or importlib.util.find_spec("skimage") is None
    or shutil.which("festival") is None,
    reason="needs mediapipe, scikit-image and festival",
)


@pytest.mark.slow
@needs_tools
def test_lrs3_recipe_runs_every_stage(tmp_path):
    from avsr.data.media import read_video, read_wav, video_fps
    from tests.test_recipe import tiny_configs

    lrs3, musan = _write_lrs3_fixture(tmp_path)
    train_cfg, decode_cfg = tiny_configs(tmp_path)
    # LRS3 has no pronunciation lexicon here: the SynthGRID configuration's phone loss off
    train = yaml.safe_load(train_cfg.read_text())
    train["model_conf"]["phone_ctc_weight"] = 0.0
    train_cfg.write_text(yaml.safe_dump(train))
    corpus, data, exp = tmp_path / "corpus", tmp_path / "data", tmp_path / "exp"
    args = [
        "--lrs3-root",
        str(lrs3),
        "--musan",
        str(musan),
        "--labeled",
        "433h",
        "--num-valid",
        "2",
        "--noise-seconds",
        "4",
        "--speech-min-seconds",
        "1",
        "--corpus-dir",
        str(corpus),
        "--data-dir",
        str(data),
        "--exp-dir",
        str(exp),
        "--train-config",
        str(train_cfg),
        "--decode-config",
        str(decode_cfg),
        "--vocab-size",
        "40",
        "--test-snrs",
        "0",
        "--tag",
        "tiny",
        "--ngpu",
        "0",
        "--nj",
        "2",
    ]
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin:/usr/local/bin",
        "PYTHONUNBUFFERED": "1",
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        ["bash", str(RECIPE / "run.sh"), *args], capture_output=True, text=True, env=env, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]

    # stage 1: splits as AV-HuBERT's (433 h = pretrain + trainval - valid), the ROI list, the noise types
    splits = json.loads((corpus / "local" / "splits.json").read_text())
    assert splits["utterances"] == {"train": 8, "valid": 2, "test": 3}
    assert len((corpus / "roi.list").read_text().splitlines()) == 13
    noise = json.loads((corpus / "noise" / "noise.json").read_text())
    assert sorted(noise["types"]) == ["babble", "music", "noise", "speech"]
    # stage 2: mouth ROIs found in the face videos, 96x96 at 25 fps, 640 samples per frame
    mp4s = sorted(corpus.glob("*/*/*.mp4"))
    assert len(mp4s) == 13 and not (corpus / "failed.tsv").exists()
    for mp4 in mp4s[:3]:
        assert mp4.stem.startswith(mp4.parent.name + "_")
        frames = read_video(mp4)
        assert frames.shape[1:] == (96, 96) and video_fps(mp4) == 25.0
        assert read_wav(mp4.with_suffix(".wav")).numel() == frames.shape[0] * 640
    # stages 3-4: data dirs and tokenizer
    for split, n in (("train", 8), ("valid", 2), ("test", 3)):
        utt2spk = [line.split() for line in (data / split / "utt2spk").read_text().splitlines()]
        assert len(utt2spk) == n and all(utt.startswith(spk + "_") for utt, spk in utt2spk)
        assert {spk for _, spk in utt2spk} <= set(SPEAKERS.values())
    assert (data / "token_list" / "bpe.model").is_file()
    # stage 9: checkpoints
    assert (exp / "tiny" / "checkpoint.pt").is_file() and list((exp / "tiny").glob("epoch*.pt"))
    # stages 10-11: every modality x {clean, each noise type at 0 dB}
    conditions = ["clean", "babble_0", "music_0", "noise_0", "speech_0"]
    for modality in ("audio", "video", "audiovisual"):
        for cond in conditions:
            hyp = exp / "tiny" / "decode" / "test" / modality / cond / "hyp"
            assert len(hyp.read_text().splitlines()) == 3, hyp
    rows = json.loads((exp / "tiny" / "results.json").read_text())
    assert {(r["modality"], r["noise"]) for r in rows} == {
        (m, n)
        for m in ("audio", "video", "audiovisual")
        for n in ("clean", "babble", "music", "noise", "speech")
    }
    assert all(r["num_utts"] == 3 and r["wer"] >= 0 for r in rows)
    assert proc.stdout.strip().splitlines()[-1] == str(exp / "tiny" / "results.json")


def _prepare_noise():
    spec = importlib.util.spec_from_file_location("prepare_noise", RECIPE / "local" / "prepare_noise.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_babble_is_mixed_from_musan_speech_when_musan_has_no_babble(tmp_path, caplog):
    from avsr.data.media import read_wav, write_wav

    rng = np.random.default_rng(0)
    for k in range(4):  # MUSAN's own layout: speech/<corpus>/<file>.wav, no babble/
        path = tmp_path / "musan" / "speech" / "librivox" / f"speech-librivox-{k:04d}.wav"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_wav(path, torch.from_numpy(rng.normal(0, 0.05 * (k + 1), 16000 + 800 * k)).float())
    out = tmp_path / "noise"
    main = _prepare_noise().main
    assert main(["--out", str(out), "--musan", str(tmp_path / "musan"), "--seconds", "2"]) == 0
    record = json.loads((out / "noise.json").read_text())
    assert list(record["types"]) == ["babble"] and "mixes of 30" in record["types"]["babble"]["source"]
    babble = read_wav(out / "babble_test.wav")
    assert babble.numel() == 32000  # --seconds 2, clips concatenated
    assert float(babble.pow(2).mean().sqrt()) == pytest.approx(10 ** (-26 / 20), rel=0.05)
    assert read_wav(out / "all_train.wav").numel() == read_wav(out / "babble_train.wav").numel()
    stamp = (out / "babble_test.wav").stat().st_mtime_ns
    assert main(["--out", str(out), "--musan", str(tmp_path / "musan"), "--seconds", "2"]) == 0
    assert (out / "babble_test.wav").stat().st_mtime_ns == stamp  # done already: nothing rewritten
    # no noise at all: a warning, clean conditions only
    assert main(["--out", str(tmp_path / "none"), "--musan", str(tmp_path / "empty")]) == 1  # missing dir
    (tmp_path / "empty").mkdir()
    assert main(["--out", str(tmp_path / "none"), "--musan", str(tmp_path / "empty")]) == 0
    assert json.loads((tmp_path / "none" / "noise.json").read_text())["types"] == {}
    assert "only clean conditions" in caplog.text
