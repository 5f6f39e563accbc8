"""Intra-op threads and the OpenMP wait policy, chosen for the machine as it is when a tool starts.

torch's default is one intra-op thread per physical core of the whole machine, with OpenMP's default wait
policy (GNU libgomp, which torch's Linux wheels use: a worker spins ~300,000 iterations at the end of every
parallel region before it sleeps). On a machine that other work shares -- a laptop, a shared server, the
recipe's own parallel jobs -- that goes badly: with 2 threads on 2 cores of which another process used one,
the SynthGRID recipe's training steps took 3-14 s instead of 0.24 s with one thread, each parallel region
waiting for a thread that had no core while its partner spun. The command-line tools (``avsr train``,
``avsr decode``, ``avsr transcribe``, ``avsr demo``) therefore choose (:func:`choose_threads`):

* **threads**: the cores this process may use -- its CPU affinity (:func:`affinity_cpus`), counted in
  physical cores (:func:`physical_cores`, as torch's default), capped by a cgroup CPU quota
  (:func:`cgroup_cpu_quota`, cgroup v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``) -- less the cores other work
  keeps busy when it starts (:func:`busy_cores`: a 0.2 s sample of ``/proc/stat`` over the CPUs of the
  affinity, less this process's own CPU time; a CPU counts as taken from half of it busy), at least 1. A
  quota is rounded to the nearest whole CPU, halves up: 1.5 CPUs on 8 idle cores give 2 threads, as the
  kernel throttles the cgroup's threads together, so that two threads still get 1.5 cores of work done per
  period against one thread's 1.0. On an idle machine without limits this is torch's own default.
* **wait policy**: ``PASSIVE`` (a waiting worker sleeps at once) when the machine is shared (half a core or
  more busy with other work at the start), a CPU quota limits the process (spinning would burn the quota),
  or the threads are not one per core (fewer: the other cores may be someone else's; more: threads
  wait for cores); else the runtime's default, whose short spin helps on a machine of one's own.

Explicit settings win: a ``num_threads`` argument (``--threads`` / ``--num-threads N``), else
``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` in the environment (which torch itself reads; torchrun sets
``OMP_NUM_THREADS=1`` for several processes per node); ``OMP_WAIT_POLICY`` (or libgomp's ``GOMP_SPINCOUNT``,
Intel/LLVM OpenMP's ``KMP_BLOCKTIME``) in the environment is never overridden. The library itself changes
nothing behind its caller's back: a :class:`~avsr.inference.Transcriber` keeps the process's thread count
(a user's ``torch.set_num_threads`` stands) unless given ``num_threads``.

**The wait policy must be set before torch loads.** libgomp reads ``OMP_WAIT_POLICY`` once, when the library
is loaded, which ``import torch`` does: setting it in ``os.environ`` after ``import torch``, even before the
first tensor operation, changes nothing (measured with torch 2.14's libgomp: 100 small parallel ops with
20 ms pauses between them cost 1.25 s of CPU time with the default, 3.1 s with ``OMP_WAIT_POLICY=ACTIVE``
set before ``import torch``, 0.07 s with ``PASSIVE`` set before it, and 1.2-1.3 s with either set after
it). libgomp has no call that changes it later. So the package :mod:`avsr.bin`, which every tool imports
before torch, calls :func:`prepare_openmp`; later, :func:`apply_threads` sets the thread count (which
``torch.set_num_threads`` changes at any time) and logs the choice once, saying which policy is in effect.
A program that imports torch itself sets ``OMP_WAIT_POLICY=PASSIVE`` in the environment before it starts
Python (``OMP_WAIT_POLICY=PASSIVE python train.py``). Intel's and LLVM's OpenMP (conda's MKL builds,
macOS) take ``OMP_WAIT_POLICY=PASSIVE`` as ``KMP_BLOCKTIME=0``.

Source: OpenMP 4.5 specification, Sec. 4.8 (``OMP_WAIT_POLICY``); GNU libgomp manual (``GOMP_SPINCOUNT``);
Linux ``proc(5)`` (``/proc/stat``), ``sched_getaffinity(2)``, cgroup v2 ``cpu.max`` and v1 CFS bandwidth
control (``Documentation/scheduler/sched-bwc.rst``).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import NamedTuple

__all__ = ["ThreadChoice", "WAIT_POLICY_VARIABLES", "affinity_cpus", "physical_cores", "cgroup_cpu_quota",
           "usable_cores", "busy_cores", "startup_load", "choose_threads", "prepare_openmp", "apply_threads",
           "parse_threads"]

logger = logging.getLogger(__name__)

#: environment variables that set how OpenMP workers wait; any of them set means the user chose.
WAIT_POLICY_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
#: environment variables that set torch's intra-op thread count at start-up (torch lets MKL's win).
THREAD_VARIABLES = ("MKL_NUM_THREADS", "OMP_NUM_THREADS")
#: seconds of /proc/stat that :func:`startup_load` samples.
SAMPLE_S = 0.2
#: the cgroup file system.
CGROUP_ROOT = Path("/sys/fs/cgroup")


class ThreadChoice(NamedTuple):
    """The intra-op thread count and OpenMP wait policy of a process, and why.

    Attributes:
        threads: intra-op threads (``torch.set_num_threads``), >= 1.
        usable: the cores this process may use (physical cores of its affinity, capped by a CPU quota;
            may be fractional under a quota).
        load: other work at the start, in busy cores (:func:`startup_load`).
        wait_policy: ``"PASSIVE"``, ``"ACTIVE"`` or ``"default"`` (the OpenMP runtime's own), or the
            runtime-specific setting the environment gives (``"GOMP_SPINCOUNT=0"``). From
            :func:`choose_threads` the policy wanted; from :func:`apply_threads` the one in effect.
        reason: why, in words.
    """

    threads: int
    usable: float
    load: float
    wait_policy: str
    reason: str

    def describe(self) -> str:
        """The one-line summary that :func:`apply_threads` logs."""
        plural = "thread" if self.threads == 1 else "threads"
        return (f"{self.threads} intra-op {plural} of {self.usable:g} usable cores (load {self.load:.1f}), "
                f"OpenMP wait policy {self.wait_policy}: {self.reason}")


def affinity_cpus() -> list[int]:
    """The CPUs (logical, by number) this process may run on: ``os.sched_getaffinity(0)``; where that does
    not exist (macOS, Windows), ``range(os.cpu_count())``."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def physical_cores(cpus: list[int], sysfs: Path = Path("/sys/devices/system/cpu")) -> int:
    """How many physical cores the logical CPUs ``cpus`` belong to (SMT siblings count once), from each
    CPU's ``topology/physical_package_id`` and ``core_id`` in sysfs; ``len(cpus)`` where those cannot be
    read."""
    cores = set()
    try:
        for cpu in cpus:
            topology = sysfs / f"cpu{cpu}" / "topology"
            cores.add(((topology / "physical_package_id").read_text().strip(),
                       (topology / "core_id").read_text().strip()))
    except OSError:
        return len(cpus)
    return max(1, len(cores))


def _read_quota(path: Path) -> float | None:
    """CPUs granted by one cgroup's quota file (``cpu.max`` or ``cpu.cfs_quota_us``), None for none."""
    try:
        if path.name == "cpu.max":  # "max 100000" or "150000 100000"
            quota, _, period = path.read_text().strip().partition(" ")
        else:
            quota = path.read_text().strip()
            period = (path.parent / "cpu.cfs_period_us").read_text().strip()
        if quota == "max" or int(quota) <= 0 or int(period) <= 0:  # v1: -1 is no limit
            return None
        return int(quota) / int(period)
    except (OSError, ValueError):
        return None


def cgroup_cpu_quota(root: Path | None = None, proc_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup, in CPUs (e.g. 1.5), or None where there is none.

    Reads cgroup v2 ``cpu.max`` ("quota period", or "max") and v1 ``cpu.cfs_quota_us`` /
    ``cpu.cfs_period_us`` (-1: none), both in the process's own cgroup (``/proc/self/cgroup``) and at the
    root of the mount (what a container sees of its own limit); the smallest quota found wins. Missing or
    unreadable files mean no limit (never an error). Ancestors between the two are not read.

    Args:
        root: the cgroup file system (default :data:`CGROUP_ROOT`).
        proc_cgroup: the process's cgroup membership file.
    """
    root = CGROUP_ROOT if root is None else root
    candidates = [root / "cpu.max"]
    for sub in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        candidates.append(root / sub / "cpu.cfs_quota_us")
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:  # "0::/user.slice/x.scope" (v2), "4:cpu,cpuacct:/docker/abc" (v1)
        parts = line.split(":", 2)
        if len(parts) != 3 or parts[2] in ("", "/"):
            continue
        path = parts[2].lstrip("/")
        if parts[0] == "0" and parts[1] == "":
            candidates.append(root / path / "cpu.max")
        elif "cpu" in parts[1].split(","):
            candidates += [root / sub / path / "cpu.cfs_quota_us" for sub in ("cpu", "cpu,cpuacct",
                                                                               "cpuacct,cpu")]
    quotas = [q for q in map(_read_quota, candidates) if q is not None]
    return min(quotas) if quotas else None


def usable_cores() -> float:
    """The cores this process may use: the physical cores of its CPU affinity, capped by a cgroup CPU quota
    (:func:`cgroup_cpu_quota`); a float (a quota may grant 1.5 CPUs), at least a little above 0."""
    cores = float(physical_cores(affinity_cpus()))
    quota = cgroup_cpu_quota()
    return min(cores, quota) if quota is not None else cores


def _cpu_jiffies(cpus: set[int], stat: Path) -> tuple[int, int, int] | None:
    """(busy, total, CPUs counted) clock ticks of ``cpus`` since boot from ``/proc/stat``, or None."""
    busy = total = n = 0
    try:
        with open(stat, encoding="ascii") as f:
            for line in f:
                name, *fields = line.split()
                if not name.startswith("cpu") or name == "cpu":
                    continue
                if not name[3:].isdigit():
                    break
                if int(name[3:]) not in cpus:
                    continue
                ticks = [int(x) for x in fields[:8]]  # user nice system idle iowait irq softirq steal
                total += sum(ticks)
                busy += sum(ticks) - ticks[3] - ticks[4]
                n += 1
    except (OSError, ValueError, IndexError):
        return None
    return (busy, total, n) if n else None


def busy_cores(sample_s: float = SAMPLE_S, stat: Path = Path("/proc/stat")) -> float:
    """Other work on this process's CPUs now, in busy cores (e.g. 1.0: one core taken by something else).

    Samples ``/proc/stat`` for ``sample_s`` seconds over the CPUs of the affinity (time in user, nice,
    system, irq, softirq and steal, i.e. not idle or waiting for I/O), less this process's own CPU time
    (``time.process_time``) over the same interval. Where ``/proc/stat`` cannot be read (not Linux), the
    1-minute load average (:func:`os.getloadavg`), else 0.

    Args:
        sample_s: seconds to sample (0.2 s: 20 clock ticks per CPU at Linux's 100 Hz).
        stat: the file to read.

    Returns:
        busy cores, >= 0, at most the number of CPUs sampled.
    """
    cpus = set(affinity_cpus())
    before, cpu0, wall0 = _cpu_jiffies(cpus, stat), time.process_time(), time.monotonic()
    if before is None:
        try:
            return max(0.0, min(float(len(cpus)), os.getloadavg()[0]))
        except (AttributeError, OSError):
            return 0.0
    time.sleep(sample_s)
    after, cpu1, wall1 = _cpu_jiffies(cpus, stat), time.process_time(), time.monotonic()
    if after is None or after[1] <= before[1]:
        return 0.0
    n = after[2]
    busy = (after[0] - before[0]) / (after[1] - before[1]) * n
    own = (cpu1 - cpu0) / max(wall1 - wall0, 1e-6)
    return max(0.0, min(float(n), busy - own))


@functools.cache
def startup_load() -> float:
    """:func:`busy_cores` sampled once per process (the first call takes :data:`SAMPLE_S` seconds): the
    load the process found when it started, which every later choice of the process uses."""
    return busy_cores()


#: the wait policy :func:`prepare_openmp` put into the environment (None: it set none).
_prepared: str | None = None


def _env_threads(environ: dict[str, str] | os._Environ) -> tuple[int, str] | None:
    """The thread count the environment sets torch to, and the variable, or None (unset or not a count)."""
    for name in THREAD_VARIABLES:  # MKL_NUM_THREADS wins over OMP_NUM_THREADS in torch
        value = environ.get(name, "").split(",")[0].strip()
        if value.isdigit() and int(value) > 0:
            return int(value), name
    return None


def _env_wait_policy(environ: dict[str, str] | os._Environ) -> str | None:
    """The wait policy the environment sets, in :attr:`ThreadChoice.wait_policy`'s words, or None."""
    if environ.get("OMP_WAIT_POLICY"):
        return environ["OMP_WAIT_POLICY"].strip().upper()
    for name in WAIT_POLICY_VARIABLES[1:]:
        if environ.get(name):
            return f"{name}={environ[name]}"
    return None


def _user_wait_policy(environ: dict[str, str] | os._Environ) -> str | None:
    """:func:`_env_wait_policy`, unless the policy is the one :func:`prepare_openmp` set."""
    if _prepared is not None and environ.get("OMP_WAIT_POLICY") == _prepared:
        return None
    return _env_wait_policy(environ)


def choose_threads(num_threads: int | None = None, *, source: str = "num_threads",
                   environ: dict[str, str] | None = None) -> ThreadChoice:
    """The intra-op threads and OpenMP wait policy for this process (the rules of the module docstring).

    Decides only: sets nothing, logs nothing. Reads the affinity, quota and the start-up load
    (:func:`startup_load`, sampled on the first call: 0.2 s).

    Args:
        num_threads: an explicit thread count (wins), or None to choose.
        source: what gave ``num_threads``, for the reason (e.g. ``"--threads"``).
        environ: the environment (default ``os.environ``).

    Returns:
        the choice; ``wait_policy`` is the one wanted (``"PASSIVE"`` or ``"default"``, or the
        environment's).

    Raises:
        ValueError: ``num_threads`` < 1.
    """
    environ = os.environ if environ is None else environ
    if num_threads is not None and num_threads < 1:
        raise ValueError(f"{source} must be at least 1, got {num_threads}")
    cpus = affinity_cpus()
    physical = float(physical_cores(cpus))
    quota = cgroup_cpu_quota()
    usable = min(physical, quota) if quota is not None else physical
    load = startup_load()
    limited = quota is not None and quota < physical
    env = _env_threads(environ)
    if num_threads is not None:
        threads, reason = int(num_threads), f"{source} {num_threads}"
    elif env is not None:
        threads, reason = env[0], f"{env[1]}={environ[env[1]]} in the environment"
    else:
        taken = math.floor(load + 0.5)  # a CPU counts as taken from half of it busy
        threads = max(1, min(math.floor(usable + 0.5), len(cpus) - taken))  # a quota of 1.5 CPUs: 2
        if limited and threads == math.floor(usable + 0.5):
            reason = f"chosen: a CPU quota of {quota:g} CPUs"
        elif load >= 0.5:
            reason = f"chosen: other work keeps {load:.1f} of {len(cpus)} CPUs busy"
        else:
            reason = "chosen: the usable cores are idle"
    policy = _user_wait_policy(environ)
    if policy is not None:
        reason += "; wait policy from the environment"
    elif limited or load >= 0.5 or threads != physical:
        policy = "PASSIVE"
        reason += "; PASSIVE as " + ("a CPU quota limits the process" if limited
                                     else "the machine is shared" if load >= 0.5
                                     else "fewer threads than cores" if threads < physical
                                     else "more threads than cores")
    else:
        policy = "default"
    return ThreadChoice(threads, usable, load, policy, reason)


def prepare_openmp(environ: dict[str, str] | None = None) -> str | None:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` in the environment where :func:`choose_threads` wants it, before
    torch loads its OpenMP runtime (which reads it once, then; see the module docstring).

    Does nothing when torch is already imported (too late: it would have no effect, and the log line of
    :func:`apply_threads` says so), or when the environment sets a wait policy. The choice sees the
    environment's ``OMP_NUM_THREADS`` and the load, not a command line's ``--threads`` (not parsed yet).
    Child processes inherit the variable.

    Args:
        environ: the environment to set it in (default ``os.environ``).

    Returns:
        the policy set (``"PASSIVE"``), or None.
    """
    global _prepared
    environ = os.environ if environ is None else environ
    if "torch" in sys.modules or _env_wait_policy(environ) is not None:
        return None
    choice = choose_threads(environ=environ)
    if choice.wait_policy != "PASSIVE":
        return None
    environ["OMP_WAIT_POLICY"] = "PASSIVE"
    _prepared = "PASSIVE"
    return _prepared


_logged: set[tuple[int, str]] = set()


def apply_threads(num_threads: int | None = None, *, source: str = "num_threads") -> ThreadChoice:
    """Choose (:func:`choose_threads`) and set torch's intra-op thread count; log the choice once.

    The thread count is set with ``torch.set_num_threads`` (effective at any time). The wait policy cannot
    change once torch is loaded: the returned ``wait_policy`` is the one in effect -- the environment's
    (set by the user, or by :func:`prepare_openmp` before torch loaded), else ``"default"``, and where the
    choice wanted ``PASSIVE`` but it is too late the reason says how to get it. One INFO line per process
    and outcome: ``"1 intra-op thread of 2 usable cores (load 1.0), OpenMP wait policy PASSIVE: chosen:
    ..."``. Overrides a thread count set earlier with ``torch.set_num_threads``: call it where the program
    owns the process (a command-line tool), or when asked to.

    Args:
        num_threads: an explicit thread count (wins), or None to choose.
        source: what gave ``num_threads``, for the log line (e.g. ``"--threads"``).

    Returns:
        the choice, with the wait policy in effect.

    Raises:
        ValueError: ``num_threads`` < 1.
    """
    import torch

    choice = choose_threads(num_threads, source=source)
    in_effect = _env_wait_policy(os.environ)
    if in_effect is None:  # the runtime's default; PASSIVE can no longer be set
        reason = choice.reason
        if choice.wait_policy == "PASSIVE" and choice.threads == 1:  # no team: the policy does not matter
            reason = reason.partition("; PASSIVE as")[0] + " (one thread: no worker waits for another)"
        elif choice.wait_policy == "PASSIVE":
            reason = reason.replace("; PASSIVE as", "; PASSIVE wanted as") + (
                ", but torch was loaded before it could be set: set OMP_WAIT_POLICY=PASSIVE before starting "
                "Python")
        choice = choice._replace(wait_policy="default", reason=reason)
    elif choice.wait_policy != in_effect:  # prepare_openmp's PASSIVE, where this choice would not want it
        choice = choice._replace(wait_policy=in_effect, reason=choice.reason + (
            "; PASSIVE set before torch loaded, as the machine was loaded then"))
    elif _prepared is not None and in_effect == _prepared:
        choice = choice._replace(reason=choice.reason + " (set before torch loaded)")
    if torch.get_num_threads() != choice.threads:
        torch.set_num_threads(choice.threads)
    key = (choice.threads, choice.wait_policy)
    if key not in _logged:
        _logged.add(key)
        logger.info("%s", choice.describe())
    return choice


def parse_threads(text: str) -> int | None:
    """A command line's thread count: ``"auto"`` -> None (choose), ``"N"`` -> N (>= 1).

    Raises:
        ValueError: anything else (argparse reports it as an invalid value).
    """
    if text.strip().lower() == "auto":
        return None
    value = int(text)
    if value < 1:
        raise ValueError(f"threads must be at least 1 or 'auto', got {text!r}")
    return value
