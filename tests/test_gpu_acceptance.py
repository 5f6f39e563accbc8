"""The GPU acceptance run (benchmarks/gpu_acceptance.sh) in its CPU form: ``--device cpu --tiny``.

The same script and functions run on a GPU with ``--device cuda``; here every step must run (or, the recipe
without festival, be skipped for a named reason) and leave its figures in ``acceptance.json``.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from gpu_acceptance import STEPS, peak_for_gpu_name  # noqa: E402


@pytest.mark.parametrize("name, peak", [
    ("NVIDIA H100 80GB HBM3", 989.4e12), ("NVIDIA H100 PCIe", 756e12), ("NVIDIA H100 NVL", 835.5e12),
    ("NVIDIA H200", 989.4e12), ("NVIDIA GH200 480GB", 989.4e12), ("NVIDIA A100-SXM4-80GB", 312e12),
    ("NVIDIA A100-PCIE-40GB", 312e12), ("NVIDIA L4", 121e12), ("NVIDIA L40S", 362.05e12),
    ("NVIDIA A10", 125e12), ("Tesla T4", None), ("NVIDIA GeForce RTX 4090", None),
])
def test_bf16_peak_is_matched_on_the_gpu_name(name, peak):
    got, note = peak_for_gpu_name(name)
    assert got == peak, note
    assert ("unknown GPU" in note) == (peak is None)


@pytest.mark.slow
def test_tiny_cpu_run_writes_every_step_with_its_figures(tmp_path):
    out = tmp_path / "acc"
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin:/usr/local/bin", "PYTHON": sys.executable}
    start = time.perf_counter()
    proc = subprocess.run(["bash", str(ROOT / "benchmarks/gpu_acceptance.sh"), "--device", "cpu", "--tiny",
                           "--out", str(out)], capture_output=True, text=True, env=env, timeout=600)
    seconds = time.perf_counter() - start
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    report = json.loads((out / "acceptance.json").read_text())
    assert report["device"] == "cpu" and report["tiny"] is True and report["ok"] and report["failed"] == []
    assert report["machine"].startswith("CPU ") and "cores" in report["machine"]
    assert 0 < report["total_s"] <= seconds
    steps = report["steps"]
    assert list(steps) == list(STEPS)
    for s in steps.values():
        assert s["status"] in ("ok", "skipped") and s["rc"] == 0 and s["seconds"] > 0, s

    tests = steps["cuda_tests"]["figures"]  # on CPU the CUDA tests are collected and skip
    assert tests["skipped"] >= 1 and tests["failed"] == tests["errors"] == 0
    files = {"tests/test_beam_search.py", "tests/test_precision.py", "tests/test_inference.py"}
    assert files <= set(tests["files"])
    assert tests["select"] == "-m cuda"

    configs = steps["train_step"]["figures"]["configs"]
    assert [c["config"] for c in configs] == ["avhubert_base (tiny)", "avhubert_large (tiny)"]
    for c in configs:
        assert isinstance(c["tokens_per_s"], float) and c["tokens_per_s"] > 0
        assert isinstance(c["flops_per_step"], int) and c["flops_per_step"] > 0
        assert c["mfu"] is None and "CPU" in c["mfu_note"] and c["peak_flops_per_s"] is None
        assert c["precision"] in ("fp32", "bf16") and c["tokens_per_step"] == c["batch"] * c["frames"] == 50
        assert c["peak_mem_mib"] > 0 and len(c["step_s"]) == c["timed_steps"]
    assert configs[1]["params"] > configs[0]["params"]  # LARGE (tiny) is the larger encoder
    assert configs[1]["flops_per_step"] > configs[0]["flops_per_step"]

    recipe = steps["recipe"]
    if recipe["status"] == "skipped":
        assert "festival" in recipe["reason"]
    else:
        times = recipe["figures"]["stage_times_s"]
        assert [k.split()[0] for k in times] == ["1", "2", "3", "4", "9", "10", "11"]
        assert all(isinstance(v, float) and v >= 0 for v in times.values())
        assert recipe["figures"]["ngpu"] == 0
        results = recipe["figures"]["results"]
        assert {(r["modality"], r["noise"]) for r in results} == {("audiovisual", "clean"),
                                                                  ("audiovisual", "babble")}
        assert all(r["wer"] >= 0 for r in results)

    modes = steps["decode"]["figures"]["modes"]
    assert [m["mode"] for m in modes] == ["att", "joint-partial", "joint-full", "ctc"]
    for m in modes:
        assert m["utt_per_s"] > 0 and m["rtf"] > 0 and m["peak_cuda_mib"] is None and m["device"] == "cpu"

    table = (out / "acceptance.md").read_text()
    assert report["machine"] in table and "| train_step | ok |" in table and "tokens/s" in table
    assert table in proc.stdout  # printed at the end
    for name in STEPS:
        assert (out / "steps" / f"{name}.log").is_file()


def test_options_are_checked():
    proc = subprocess.run(["bash", str(ROOT / "benchmarks/gpu_acceptance.sh"), "--devise", "cpu"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--devise" in proc.stderr
    proc = subprocess.run(["bash", str(ROOT / "benchmarks/gpu_acceptance.sh"), "--device", "tpu"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "tpu" in proc.stderr


def test_mfu_is_flops_per_step_over_step_time_and_peak(monkeypatch, one_thread):
    # the GPU branch of the MFU, on a CPU: a known peak in place of the table's
    import gpu_acceptance

    monkeypatch.setattr(gpu_acceptance, "peak_bf16_flops", lambda device: (1e12, "test peak"))
    row = gpu_acceptance.train_step_figures("avhubert_base", "cpu", "bf16", batch=1, frames=5, steps=1,
                                            warmup=0, tiny=True)
    assert row["precision"] == "bf16" and row["peak_flops_per_s"] == 1e12 and row["mfu_note"] == "test peak"
    assert row["mfu"] == pytest.approx(row["flops_per_step"] / row["step_s_median"] / 1e12)
    assert row["tokens_per_s"] == pytest.approx(5 / row["step_s_median"])
    # fp32: the bf16 peak does not apply
    row = gpu_acceptance.train_step_figures("avhubert_base", "cpu", "fp32", batch=1, frames=5, steps=1,
                                            warmup=0, tiny=True)
    assert row["mfu"] is None and "fp32" in row["mfu_note"]


def test_report_records_a_failed_step_and_exits_non_zero(tmp_path, capsys):
    import gpu_acceptance

    steps = tmp_path / "steps"
    steps.mkdir()
    (steps / "cuda_tests.rc").write_text("0\n")
    (steps / "cuda_tests.seconds").write_text("1.5\n")
    (steps / "cuda_tests.json").write_text(json.dumps({"passed": 1, "skipped": 0, "failed": 0, "errors": 0}))
    (steps / "train_step.rc").write_text("1\n")
    (steps / "train_step.seconds").write_text("2.0\n")
    lines = [f"line {i}" for i in range(30)]
    (steps / "train_step.log").write_text("\n".join([*lines, "RuntimeError: boom"]) + "\n")
    (steps / "recipe.rc").write_text("0\n")
    (steps / "recipe.seconds").write_text("0.1\n")
    (steps / "recipe.json").write_text(json.dumps({"skip_reason": "festival is not installed"}))
    rc = gpu_acceptance.main(["report", "--device", "cpu", "--tiny", "--out", str(tmp_path),
                              "--total-s", "4"])
    assert rc == 1
    report = json.loads((tmp_path / "acceptance.json").read_text())
    s = report["steps"]
    assert s["cuda_tests"]["status"] == "ok" and s["cuda_tests"]["figures"]["passed"] == 1
    assert s["train_step"]["status"] == "failed" and s["train_step"]["rc"] == 1
    assert s["train_step"]["log_tail"][-1] == "RuntimeError: boom" and len(s["train_step"]["log_tail"]) == 20
    assert s["recipe"]["status"] == "skipped" and s["recipe"]["reason"] == "festival is not installed"
    assert s["decode"]["status"] == "not run"
    assert report["failed"] == ["train_step", "decode"] and not report["ok"] and report["total_s"] == 4
    table = (tmp_path / "acceptance.md").read_text()
    assert "| train_step | failed |" in table and "FAILED: train_step, decode" in table
    assert "RuntimeError: boom" in capsys.readouterr().out
