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
    assert "tests/test_beam_search.py" in tests["files"]

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
