"""Emulated heterogeneity: a per-rank slowdown factor for hosts whose devices are all alike.

A factor f makes every forward and backward cost f times its CPU work: after the real compute, the
rank spins until it has used (f - 1) x that compute's CPU seconds more (measured with the thread's
CPU clock, not the wall clock). This is what hetsim's simulator means by `slowdown` on a node with
`shared_cores`: a device's work is scaled by f and then shares the cores fairly with the other busy
ranks. A sleep would not match it: a sleeping rank frees its core for the others, so on a host with
fewer cores than busy ranks a sleeping "slow" rank would speed its neighbours up.
"""

from __future__ import annotations

import time

__all__ = ["Emulation", "EMULATION_NOTE"]

EMULATION_NOTE = ("emulated heterogeneity: slowdown factor f = busy-wait of (f - 1) x the CPU time of "
                  "each forward/backward on that rank; not a real slower device")


class Emulation:
    def __init__(self, factor: float = 1.0):
        if not factor > 0:
            raise ValueError(f"slowdown must be > 0, got {factor}")
        self.factor = factor

    def start(self) -> float:
        return time.thread_time()

    def stretch(self, cpu_start: float) -> None:
        """Spin for (factor - 1) x the CPU seconds used since `cpu_start` (nothing when factor <= 1)."""
        if self.factor <= 1.0:
            return
        now = time.thread_time()
        target = now + (now - cpu_start) * (self.factor - 1.0)
        while time.thread_time() < target:
            pass
