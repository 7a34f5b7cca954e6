"""What this host gives the executor's ranks: the cores they may run on (and how many they get right
now), and the memory they share. Container limits count: a cgroup's CPU quota and memory limit, of
the process's own cgroup and of every one above it, under cgroup v2 (cpu.max, memory.max) or v1
(cpu.cfs_quota_us / cpu.cfs_period_us, memory.limit_in_bytes)."""

from __future__ import annotations

import math
import multiprocessing
import os
import time
from pathlib import Path

__all__ = ["available_cores", "usable_cores", "host_memory_bytes"]

CGROUP_ROOT = "/sys/fs/cgroup"
SELF_CGROUP = "/proc/self/cgroup"
# cgroup v1 mounts each controller on a folder of its own, under these usual names.
_V1_MOUNTS = {"cpu": ("cpu", "cpu,cpuacct", "cpuacct,cpu"), "memory": ("memory",)}


def available_cores(seconds: float = 1.0, tries: int = 3) -> float:
    """How many of this host's cores our processes get right now: spin one process per core and add
    up the CPU time each received (on a quiet host this is the core count; other load lowers it).
    Short of the core count, it measures again, up to `tries` times, and keeps the most: the probes
    validate runs just before leave the host busy for a moment after their processes are joined
    (right after executor.colocation's four probes of vw2_tp2_bsp_gpt: 1.78 cores, 3 s later 1.99),
    load that will not be there during the run, while other load lowers every try."""
    cores, usable = 0.0, usable_cores()
    for _ in range(tries):
        cores = max(cores, _cores_now(seconds, math.ceil(usable)))
        if cores >= usable - 0.05:
            break
    return cores


def usable_cores(cgroup_root: str = CGROUP_ROOT, self_cgroup: str = SELF_CGROUP) -> float:
    """Cores this process may run on: its CPU affinity, capped by the CPU quota of its cgroup and of
    every cgroup above it, as in a container given 1.5 CPUs on a larger host."""
    cores = float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    for quota in _cpu_quotas(cgroup_root, self_cgroup):
        cores = min(cores, quota)
    return cores


def host_memory_bytes(cgroup_root: str = CGROUP_ROOT, self_cgroup: str = SELF_CGROUP) -> int:
    """The memory this process and its children share: the host's physical memory, capped by the
    memory limit of its cgroup and of every cgroup above it."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for folder in _cgroup_folders(cgroup_root, self_cgroup, "memory"):
        for name in ("memory.max", "memory.limit_in_bytes"):    # v2, v1 ("max" / a huge number: none)
            value = _read(folder / name)
            if value and value[0].isdigit():
                total = min(total, int(value[0]))
    return total


def _cpu_quotas(root: str, self_cgroup: str) -> list[float]:
    """Each CPU quota above this process, in cores."""
    quotas = []
    for folder in _cgroup_folders(root, self_cgroup, "cpu"):
        v2 = _read(folder / "cpu.max")                       # "QUOTA PERIOD" or "max PERIOD"
        v1 = (_read(folder / "cpu.cfs_quota_us") or []) + (_read(folder / "cpu.cfs_period_us") or [])
        for pair in (v2, v1):
            if pair and len(pair) >= 2 and _positive_int(pair[0]) and _positive_int(pair[1]):
                quotas.append(int(pair[0]) / int(pair[1]))   # v1's "-1" and v2's "max" mean none
    return quotas


def _cgroup_folders(root: str, self_cgroup: str, controller: str) -> list[Path]:
    """The folders of this process's cgroup and of each one above it: under v2 on `root` itself (the
    "0::/path" line of /proc/self/cgroup), under v1 on the controller's own mount (a line
    "N:...,controller,...:/path"). Inside a container the path may name the host's hierarchy while the
    container sees its own cgroup at the mount's root, which every list ends with."""
    mounts = [Path(root, d) for d in _V1_MOUNTS[controller]]
    try:
        lines = Path(self_cgroup).read_text().splitlines()
    except OSError:
        return [Path(root), *mounts]
    folders = []
    for line in lines:
        number, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if number == "0" and controllers == "":
            bases = [Path(root)]
        elif controller in controllers.split(","):
            bases = mounts
        else:
            continue
        parts = [p for p in path.split("/") if p]
        folders += [Path(base, *parts[:i]) for base in bases for i in range(len(parts), -1, -1)]
    return folders or [Path(root), *mounts]


def _read(path: Path) -> list[str] | None:
    try:
        return path.read_text().split()
    except OSError:
        return None


def _positive_int(text: str) -> bool:
    return text.isdigit() and int(text) > 0


def _spin(seconds: float, out) -> None:
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - wall0 < seconds:
        pass
    out.put(time.process_time() - cpu0)


def _cores_now(seconds: float, n: int) -> float:
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_spin, args=(seconds, out)) for _ in range(n)]
    for p in procs:
        p.start()
    cpu = sum(out.get() for _ in procs)
    for p in procs:
        p.join()
    return round(cpu / seconds, 2)
