"""End to end: the default SynthGRID recipe, every stage, on a tiny configuration (about a minute)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "synthgrid" / "avsr1"

pytestmark = pytest.mark.skipif(shutil.which("festival") is None, reason="festival is not installed")


def tiny_configs(tmp_path: Path) -> tuple[Path, Path]:
    train = yaml.safe_load((ROOT / "conf/train/avsr_synthgrid_cpu.yaml").read_text())
    model = yaml.safe_load((ROOT / "conf/train" / train.pop("model_config")).read_text())
    train.update(model, max_epoch=2, batch_frames=800, warmup_steps=5, keep_nbest=2)
    train["encoder_conf"].update(encoder_layers=1, encoder_embed_dim=32, encoder_ffn_embed_dim=64,
                                 encoder_attention_heads=2, conv_pos=8, conv_pos_groups=4,
                                 resnet_widths=[4, 4, 8, 8])
    train["decoder_conf"].update(decoder_layers=1, decoder_embed_dim=32, decoder_ffn_embed_dim=64,
                                 decoder_attention_heads=2)
    decode = yaml.safe_load((ROOT / "conf/decode/default.yaml").read_text())
    decode.update(beam_size=2, maxlenratio=0.5)
    (tmp_path / "train.yaml").write_text(yaml.safe_dump(train))
    (tmp_path / "decode.yaml").write_text(yaml.safe_dump(decode))
    return tmp_path / "train.yaml", tmp_path / "decode.yaml"


def run(args: list[str], **kw) -> subprocess.CompletedProcess:
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin:/usr/local/bin", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(["bash", str(RECIPE / "run.sh"), *args], capture_output=True, text=True, env=env,
                          timeout=900, **kw)


@pytest.mark.slow
def test_default_recipe_runs_every_stage_and_resumes(tmp_path):
    train_cfg, decode_cfg = tiny_configs(tmp_path)
    common = ["--corpus-dir", str(tmp_path / "corpus"), "--data-dir", str(tmp_path / "data"),
              "--exp-dir", str(tmp_path / "exp"), "--num-train", "24", "--num-valid", "4", "--num-test", "6",
              "--train-speakers", "4",
              "--babble-seconds", "8", "--train-config", str(train_cfg), "--decode-config", str(decode_cfg),
              "--test-snrs", "0 -5", "--tag", "tiny"]
    proc = run(common)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    exp = tmp_path / "exp" / "tiny"
    results_path = exp / "results.json"
    assert proc.stdout.strip().splitlines()[-1] == str(results_path)

    rows = json.loads(results_path.read_text())
    conditions = {(r["modality"], r["noise"], r["snr_db"]) for r in rows}
    assert conditions == {(m, n, s) for m in ("audio", "video", "audiovisual")
                          for n, s in (("clean", None), ("babble", 0.0), ("babble", -5.0))}
    for r in rows:
        assert r["test_set"] == "test" and r["num_utts"] == 6 and r["num_words"] == 36
        assert r["wer"] >= 0
    # video input does not depend on the audio noise
    video = {r["snr_db"]: r["wer"] for r in rows if r["modality"] == "video"}
    assert len(set(video.values())) == 1
    assert (exp / "RESULTS.md").read_text().count("audiovisual") >= 1
    assert (exp / "wer_vs_snr.png").read_bytes()[:4] == b"\x89PNG"
    stages = [line.split("\t")[0] for line in (exp / "stage_times.tsv").read_text().splitlines()]
    assert stages == ["1", "2", "3", "4", "5", "6"]
    for split, n in (("train", 24), ("valid", 4), ("test", 6)):
        assert len((tmp_path / "data" / split / "text").read_text().splitlines()) == n

    # idempotent stages: training resumes (already finished), decoding skips finished conditions
    hyp = exp / "decode" / "test" / "audio" / "clean" / "hyp"
    before = hyp.stat().st_mtime_ns
    proc = run([*common, "--stage", "4"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "training already finished" in (exp / "logs" / "stage4.log").read_text()
    assert hyp.stat().st_mtime_ns == before

    # a misspelt option is refused by name
    proc = run([*common, "--stage", "6", "--beam-szie", "3"])
    assert proc.returncode != 0 and "--beam-szie" in proc.stderr
