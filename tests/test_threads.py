"""Intra-op threads and the OpenMP wait policy chosen for the machine as it is (avsr.threads)."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from avsr import threads
from avsr.threads import ThreadChoice, apply_threads, choose_threads, parse_threads, prepare_openmp

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def machine(monkeypatch):
    """A fake machine: ``machine(cores, busy=0.0, quota=None)`` sets what the readers report."""
    monkeypatch.setattr(threads, "_prepared", None)
    monkeypatch.setattr(threads, "_logged", set())
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", *threads.WAIT_POLICY_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    before = torch.get_num_threads()

    def set_machine(cores: int, busy: float = 0.0, quota: float | None = None) -> None:
        monkeypatch.setattr(threads, "affinity_cpus", lambda: list(range(cores)))
        monkeypatch.setattr(threads, "physical_cores", lambda cpus: len(cpus))
        monkeypatch.setattr(threads, "cgroup_cpu_quota", lambda: quota)
        monkeypatch.setattr(threads, "busy_cores", lambda: busy)
        threads.startup_load.cache_clear()

    yield set_machine
    threads.startup_load.cache_clear()
    torch.set_num_threads(before)


def test_two_idle_cores_get_two_threads_and_the_runtimes_wait_policy(machine):
    machine(2)
    choice = choose_threads(environ={})
    assert (choice.threads, choice.usable, choice.wait_policy) == (2, 2.0, "default")


def test_two_cores_with_one_busy_get_one_thread_that_sleeps_when_it_waits(machine):
    machine(2, busy=1.0)
    choice = choose_threads(environ={})
    assert (choice.threads, choice.wait_policy) == (1, "PASSIVE")
    assert "busy" in choice.reason and "shared" in choice.reason


@pytest.mark.parametrize("busy, expected", [(0.3, 4), (0.5, 3), (1.4, 3), (1.6, 2), (3.9, 1), (4.0, 1)])
def test_a_core_counts_as_taken_from_half_of_it_busy(machine, busy, expected):
    machine(4, busy=busy)
    assert choose_threads(environ={}).threads == expected


def test_a_quota_of_one_and_a_half_cpus_on_eight_cores_gives_two_passive_threads(machine):
    machine(8, quota=1.5)
    choice = choose_threads(environ={})
    assert (choice.threads, choice.usable, choice.wait_policy) == (2, 1.5, "PASSIVE")
    assert "quota of 1.5 CPUs" in choice.reason
    machine(8, quota=0.5)
    assert choose_threads(environ={}).threads == 1
    machine(8, quota=1.5, busy=7.0)  # the quota allows more than the machine leaves free
    assert choose_threads(environ={}).threads == 1


def test_an_explicit_setting_wins_argument_before_environment(machine):
    machine(2, busy=1.0)
    assert choose_threads(3, source="--threads", environ={"OMP_NUM_THREADS": "1"}).threads == 3
    choice = choose_threads(environ={"OMP_NUM_THREADS": "2"})
    assert choice.threads == 2 and "OMP_NUM_THREADS=2" in choice.reason
    assert choose_threads(environ={"OMP_NUM_THREADS": "4,2"}).threads == 4  # nested: the outer level
    assert choose_threads(environ={"OMP_NUM_THREADS": "x"}).threads == 1  # not a count: chosen
    assert choose_threads(environ={"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "3"}).threads == 3  # as torch
    with pytest.raises(ValueError, match="--threads must be at least 1"):
        choose_threads(0, source="--threads")


def test_the_environments_wait_policy_is_kept(machine):
    machine(2, busy=1.0)
    assert choose_threads(environ={"OMP_WAIT_POLICY": "active"}).wait_policy == "ACTIVE"
    assert choose_threads(environ={"GOMP_SPINCOUNT": "0"}).wait_policy == "GOMP_SPINCOUNT=0"
    machine(2)
    assert choose_threads(1, environ={}).wait_policy == "PASSIVE"  # fewer threads than cores
    assert choose_threads(4, environ={}).wait_policy == "PASSIVE"  # more


def test_apply_sets_torchs_threads_and_logs_the_choice_once(machine, caplog):
    machine(2, busy=1.0)
    with caplog.at_level(logging.INFO, logger="avsr.threads"):
        first = apply_threads()
        again = apply_threads()
    assert first == again and torch.get_num_threads() == 1
    lines = [r.getMessage() for r in caplog.records if r.name == "avsr.threads"]
    assert len(lines) == 1
    assert lines[0].startswith("1 intra-op thread of 2 usable cores (load 1.0), OpenMP wait policy ")
    # torch is loaded (by this test process): PASSIVE can no longer be set; one thread never waits for another
    assert first.wait_policy == "default" and "one thread: no worker waits" in lines[0]
    machine(4, busy=1.0)
    with caplog.at_level(logging.INFO, logger="avsr.threads"):
        three = apply_threads()
    assert three.threads == 3 and three.wait_policy == "default"  # and the line says how to get PASSIVE
    assert "OMP_WAIT_POLICY=PASSIVE before starting Python" in caplog.records[-1].getMessage()


def test_apply_reports_the_wait_policy_in_effect(machine, monkeypatch):
    machine(2, busy=1.0)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setattr(threads, "_prepared", "PASSIVE")  # as prepare_openmp leaves it
    choice = apply_threads(2, source="--threads")
    assert choice.threads == 2 == torch.get_num_threads()
    assert choice.wait_policy == "PASSIVE" and "set before torch loaded" in choice.reason
    monkeypatch.setattr(threads, "_prepared", None)  # the user's own
    assert apply_threads().wait_policy == "PASSIVE"


def test_prepare_sets_passive_before_torch_loads_where_the_machine_is_shared(machine, monkeypatch):
    machine(2, busy=1.0)
    environ: dict[str, str] = {}
    assert prepare_openmp(environ) is None and environ == {}  # torch is loaded here: too late
    monkeypatch.delitem(sys.modules, "torch")
    assert prepare_openmp(environ) == "PASSIVE" and environ == {"OMP_WAIT_POLICY": "PASSIVE"}
    monkeypatch.setattr(threads, "_prepared", None)
    user = {"OMP_WAIT_POLICY": "ACTIVE"}
    assert prepare_openmp(user) is None and user == {"OMP_WAIT_POLICY": "ACTIVE"}
    machine(2)
    idle: dict[str, str] = {}
    assert prepare_openmp(idle) is None and idle == {}


def test_the_module_loads_before_torch_so_the_tools_can_set_the_policy_in_time():
    code = "import sys, avsr.threads; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=60)


def test_cgroup_quotas_of_v2_and_v1_and_none(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("0::/\n")
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert threads.cgroup_cpu_quota(tmp_path, proc) == 1.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert threads.cgroup_cpu_quota(tmp_path, proc) is None
    (tmp_path / "cpu.max").write_text("garbage\n")
    assert threads.cgroup_cpu_quota(tmp_path, proc) is None
    (tmp_path / "cpu.max").unlink()
    v1 = tmp_path / "cpu,cpuacct" / "docker" / "abc"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("50000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    proc.write_text("4:cpu,cpuacct:/docker/abc\n1:name=systemd:/\n")
    assert threads.cgroup_cpu_quota(tmp_path, proc) == 0.5
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert threads.cgroup_cpu_quota(tmp_path, proc) is None
    assert threads.cgroup_cpu_quota(tmp_path / "missing", tmp_path / "no_such_file") is None


def test_proc_stat_gives_the_busy_ticks_of_the_processs_cpus(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  10 0 10 80 0 0 0 0 0 0\n"
                    "cpu0 5 0 5 40 0 0 0 0 0 0\n"
                    "cpu1 5 1 5 30 9 0 0 2 0 0\n"
                    "intr 123\n")
    assert threads._cpu_jiffies({0, 1}, stat) == (10 + 13, 50 + 52, 2)
    assert threads._cpu_jiffies({1}, stat) == (13, 52, 1)  # iowait counts as idle, steal as busy
    assert threads._cpu_jiffies({5}, stat) is None


def test_busy_cores_is_the_others_share_of_the_sampled_ticks(monkeypatch):
    samples = iter([(100, 1000, 2), (300, 1400, 2)])  # 200 of 400 ticks busy over 2 CPUs: 1 core
    monkeypatch.setattr(threads, "_cpu_jiffies", lambda cpus, stat: next(samples))
    assert threads.busy_cores(0.05) == pytest.approx(1.0, abs=0.2)  # less this (sleeping) process's own


def test_physical_cores_count_smt_siblings_once(tmp_path):
    for cpu, core in ((0, 0), (1, 0), (2, 1), (3, 1)):
        topology = tmp_path / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text("0\n")
        (topology / "core_id").write_text(f"{core}\n")
    assert threads.physical_cores([0, 1, 2, 3], tmp_path) == 2
    assert threads.physical_cores([0, 2], tmp_path) == 2
    assert threads.physical_cores([0, 7], tmp_path) == 2  # unreadable: the logical count


def test_command_line_thread_counts():
    assert parse_threads("auto") is None and parse_threads("3") == 3
    for bad in ("0", "-1", "two"):
        with pytest.raises(ValueError):
            parse_threads(bad)


def test_the_summary_line():
    line = ThreadChoice(2, 1.5, 0.04, "PASSIVE", "chosen: a CPU quota of 1.5 CPUs").describe()
    assert line == ("2 intra-op threads of 1.5 usable cores (load 0.0), OpenMP wait policy PASSIVE: "
                    "chosen: a CPU quota of 1.5 CPUs")


def test_a_transcriber_keeps_the_processs_threads_unless_asked(machine, monkeypatch):
    from avsr.inference import Transcriber
    from avsr.models.asr import AVSRModel
    from avsr.models.config import ModelConfig

    machine(2, busy=1.0)
    encoder = dict(encoder_layers=1, encoder_embed_dim=32, encoder_ffn_embed_dim=64,
                   encoder_attention_heads=4, conv_pos=4, conv_pos_groups=4, resnet_widths=[4, 4, 4, 4])
    decoder = dict(decoder_layers=1, decoder_embed_dim=32, decoder_ffn_embed_dim=64,
                   decoder_attention_heads=4)
    model = AVSRModel(ModelConfig(vocab_size=6, token_list=["<blank>", "A", "B", "C", "D", "<sos/eos>"],
                                  encoder_conf=encoder, decoder_conf=decoder))
    calls = []
    monkeypatch.setattr("avsr.inference.transcriber.apply_threads", lambda n, source: calls.append(n))
    Transcriber(model, None)
    Transcriber(model, None, num_threads="auto")
    Transcriber(model, None, num_threads=3)
    assert calls == [None, 3]
    with pytest.raises(ValueError, match="num_threads"):
        Transcriber(model, None, num_threads="all")
