"""End to end: the default SynthGRID recipe, every stage, on a tiny configuration (about a minute)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from avsr.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "synthgrid" / "avsr1"
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_acceptance import tiny_recipe_configs  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("festival") is None, reason="festival is not installed")


def tiny_configs(tmp_path: Path) -> tuple[Path, Path]:
    """The tiny model of the GPU acceptance run's recipe step, for 2 epochs."""
    return tiny_recipe_configs(tmp_path, max_epoch=2)


def run(args: list[str], **kw) -> subprocess.CompletedProcess:
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin:/usr/local/bin", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(["bash", str(RECIPE / "run.sh"), *args], capture_output=True, text=True, env=env,
                          timeout=900, **kw)


@pytest.mark.slow
def test_default_recipe_runs_every_stage_and_resumes(tmp_path):
    train_cfg, decode_cfg = tiny_configs(tmp_path)
    common = ["--corpus-dir", str(tmp_path / "corpus"), "--data-dir", str(tmp_path / "data"),
              "--exp-dir", str(tmp_path / "exp"), "--num-train", "24", "--num-valid", "4", "--num-test", "6",
              "--train-speakers", "6", "--num-test-unseen-voice", "4", "--test-unseen-voice-speakers", "2",
              "--num-test-espeak-ng", "3", "--num-test-flite", "2", "--test-engine-speakers", "1",
              "--babble-seconds", "8", "--train-config", str(train_cfg), "--decode-config", str(decode_cfg),
              "--test-snrs", "0 -5", "--tag", "tiny"]
    proc = run(common)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    exp = tmp_path / "exp" / "tiny"
    results_path = exp / "results.json"
    assert proc.stdout.strip().splitlines()[-1] == str(results_path)

    rows = json.loads(results_path.read_text())
    conditions = {(r["test_set"], r["modality"], r["noise"], r["snr_db"]) for r in rows}
    sizes = {"test": 6, "test_unseen_voice": 4, "test_espeak_ng": 3, "test_flite": 2, "test_edges": 6,
             "test_other_lips": 6, "test_frozen_mouth": 6, "test_photo_lips": 6}  # stage 3's lip test sets
    assert conditions == {(t, m, n, s) for t in sizes for m in ("audio", "video", "audiovisual")
                          for n, s in (("clean", None), ("babble", 0.0), ("babble", -5.0))}
    for r in rows:
        utts = sizes[r["test_set"]]
        assert r["num_utts"] == utts and r["num_words"] == 6 * utts and r["wer"] >= 0
    # every input's edges are brought into the range the trainer recorded, where the audio shows them: clean,
    # not in babble (the video-only decode finds them in the noisy audio too, so the noisy conditions agree)
    edges = load_checkpoint(next(exp.glob("epoch*.pt")))["data_stats"]["edge_frames"]
    # the default config's phone loss learned the corpus' GRID lexicon (run.sh passes --phone-lexicon)
    assert (exp / "lexicon.txt").read_text() == (tmp_path / "corpus" / "lexicon.txt").read_text()
    assert load_checkpoint(next(exp.glob("epoch*.pt")))["model_config"]["model_conf"]["phone_ctc_weight"] > 0
    assert len(edges) == 2 and all(0 <= lo <= hi for lo, hi in edges)
    settings = yaml.safe_load((exp / "decode/test/video/decode_settings.yaml").read_text())
    assert settings["edge_frames"] == edges
    # audio-visual results are ranked with the single-stream views too (a gated model's default weights);
    # only their settings record them, so the audio-only and video-only results do not depend on them
    av_settings = yaml.safe_load((exp / "decode/test/audiovisual/decode_settings.yaml").read_text())
    assert av_settings["view_weights"] == {"video_weight": 1.0, "audio_weight": 3.0, "audio_confidence": 2.0}
    assert av_settings["video_sync"] == {"video_sync_margin": 0.16, "video_sync_slope": 1.0,
                                         "video_max_entropy": 0.3}
    assert "view_weights" not in settings and "video_sync" not in settings
    assert not {"video_weight", "audio_weight", "video_sync_margin"} & set(av_settings["decode_config"])
    # one process per test set: the audio-visual pass searched the views and gave both their hypotheses
    log = (exp / "logs" / "decode_test.log").read_text()
    for modality in ("audio", "video"):
        assert f"test/{modality}/babble_0: 6 utterances from the audio-visual pass's {modality} view" in log
    video = {r["snr_db"]: r["wer"] for r in rows
             if r["modality"] == "video" and r["test_set"] == "test" and r["snr_db"] is not None}
    assert len(video) == 2 and len(set(video.values())) == 1
    results_md = (exp / "RESULTS.md").read_text()
    assert results_md.count("audiovisual") >= 1
    # the SynthGRID tables of local/results_tables.sh: per slot, letter confusions, per voice
    assert "errors per slot" in results_md and "letter confusions" in results_md
    assert "WER per voice" in results_md and "upc_ca_ona_hts" in results_md
    assert (exp / "wer_vs_snr.png").read_bytes()[:4] == b"\x89PNG"
    stages = [line.split("\t")[0] for line in (exp / "stage_times.tsv").read_text().splitlines()]
    assert stages == ["1", "2", "3", "4", "9", "10", "11"]
    for split, n in (("train", 24), ("valid", 4), *sizes.items()):
        assert len((tmp_path / "data" / split / "text").read_text().splitlines()) == n
    # the training speakers take the three engines in turn (run.sh's default --engines)
    speakers = json.loads((tmp_path / "corpus" / "speakers.json").read_text()).values()
    assert [s.get("engine", "festival") for s in speakers if s["split"] == "train"] == [
        "festival", "espeak-ng", "flite"] * 2
    # test_edges: the test utterances with each end cut to the speech or 10-25 frames longer
    def kaldi_map(path):
        return dict(line.split(" ", 1) for line in path.read_text().splitlines())

    frames = kaldi_map(tmp_path / "data" / "test" / "utt2num_frames")
    edged = kaldi_map(tmp_path / "data" / "test_edges" / "utt2num_frames")
    for utt, change in kaldi_map(tmp_path / "data" / "test_edges" / "edges").items():
        start, end = map(int, change.split())
        assert all(k <= 0 or 10 <= k <= 25 for k in (start, end))
        assert int(edged[utt]) == int(frames[utt]) + start + end

    # idempotent stages: training resumes (already finished), decoding skips finished conditions
    hyp = exp / "decode" / "test" / "audio" / "clean" / "hyp"
    before = hyp.stat().st_mtime_ns
    proc = run([*common, "--stage", "9"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "training already finished" in (exp / "logs" / "stage9.log").read_text()
    assert hyp.stat().st_mtime_ns == before

    # a misspelt option is refused by name
    proc = run([*common, "--stage", "11", "--beam-szie", "3"])
    assert proc.returncode != 0 and "--beam-szie" in proc.stderr


def tiny_pretrain_config(tmp_path: Path, train_cfg: Path) -> Path:
    """A pretraining config with the tiny encoder of ``train_cfg`` (so fine-tuning can load it)."""
    pre = yaml.safe_load((ROOT / "conf/pretrain/avhubert_synthgrid_cpu.yaml").read_text())
    pre.pop("model_config")
    enc = yaml.safe_load(train_cfg.read_text())["encoder_conf"]
    pre["encoder_conf"] = {**enc, **pre["encoder_conf"]}
    pre.update(max_epoch=1, batch_frames=800, warmup_steps=2, keep_nbest=1)
    pre["pretrain_conf"]["final_dim"] = 16
    (tmp_path / "pretrain.yaml").write_text(yaml.safe_dump(pre))
    return tmp_path / "pretrain.yaml"


@pytest.mark.slow
def test_pretrain_recipe_clusters_pretrains_and_compares_with_scratch(tmp_path):
    train_cfg, decode_cfg = tiny_configs(tmp_path)
    pre_cfg = tiny_pretrain_config(tmp_path, train_cfg)
    args = ["--corpus-dir", str(tmp_path / "corpus"), "--data-dir", str(tmp_path / "data"),
            "--exp-dir", str(tmp_path / "exp"), "--num-train", "20", "--num-valid", "4", "--num-test", "4",
            "--train-speakers", "4", "--num-test-unseen-voice", "4", "--test-unseen-voice-speakers", "2",
            "--babble-seconds", "8", "--pretrain-config", str(pre_cfg),
            "--train-config", str(train_cfg), "--decode-config", str(decode_cfg), "--test-snrs", "0",
            "--km-classes", "8", "--km-classes2", "6", "--finetune-percent", "50", "--tag", "tiny",
            "--lip-test-sets", ""]  # no lip test sets: the default recipe's test makes and decodes them
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin:/usr/local/bin", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(["bash", str(RECIPE / "run_pretrain.sh"), *args], capture_output=True, text=True,
                          env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data, exp = tmp_path / "data", tmp_path / "exp"
    # the labeled subset: half of the training utterances, every speaker kept
    sub = (data / "train_50pct" / "text").read_text().splitlines()
    assert len(sub) == 10 and {u.split("_")[0] for u in sub} == {
        u.split("_")[0] for u in (data / "train" / "text").read_text().splitlines()}
    # iteration 1: MFCC labels at 100 Hz, iteration 2: layer labels at 25 Hz, for train and valid
    frames = dict(line.split() for line in (data / "train" / "utt2num_frames").read_text().splitlines())
    for it, rate, k in ((1, 100, 8), (2, 25, 6)):
        meta = json.loads((data / "train" / f"iter{it}.km.json").read_text())
        assert meta["label_rate"] == rate and meta["num_classes"] == k
        for line in (data / "train" / f"iter{it}.km").read_text().splitlines():
            utt, *labels = line.split()
            assert abs(len(labels) - int(frames[utt]) * rate / 25) <= rate / 25 * 2
            assert all(0 <= int(x) < k for x in labels)
        assert (data / "valid" / f"iter{it}.km").is_file()
        assert (exp / "pretrain_pretrain" / "km").exists() or (exp / f"pretrain_pretrain_iter{it}").is_dir()
    # fine-tuning started from the pretrained encoder; the baseline did not
    assert "encoder initialised from" in (exp / "tiny_pretrained" / "train.log").read_text()
    assert "encoder initialised from" not in (exp / "tiny_scratch" / "train.log").read_text()
    rows = json.loads((exp / "tiny_compare" / "results.json").read_text())
    assert {r["system"] for r in rows} == {"tiny_pretrained", "tiny_scratch"}
    assert {r["test_set"] for r in rows} == {"test", "test_unseen_voice", "test_edges"}
    assert len(rows) == 2 * 3 * 3 * 2  # systems x test sets x modalities x (clean, babble 0 dB)
    md = (exp / "tiny_compare" / "RESULTS.md").read_text()
    assert "Systems compared" in md and "Cluster quality" in md and "PNMI" in md
    times = (exp / "tiny_compare" / "stage_times.tsv").read_text().splitlines()
    stages = [line.split("\t")[0] for line in times]
    assert stages == [str(n) for n in range(1, 12)]
