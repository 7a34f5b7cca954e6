"""Emulated heterogeneity: a per-rank slowdown factor for hosts whose devices are all alike.

A factor f makes every forward and backward cost f times its work: after the real compute, the
rank keeps its device busy for (f - 1) x that compute's work more.
- CPU: the work is the thread's CPU seconds, and the rank spins on its CPU clock. This is what
  hetsim's simulator means by `slowdown` on a node with `shared_cores`: a device's work is scaled by
  f and then shares the cores fairly with the other busy ranks. A sleep would not match it: a
  sleeping rank frees its core for the others, so on a host with fewer cores than busy ranks a
  sleeping "slow" rank would speed its neighbours up.
- CUDA: the work is the compute's wall time up to a synchronisation, and the rank runs a spinning
  kernel (torch.cuda._sleep) that long times (f - 1), so the GPU stays occupied as a slower GPU
  would be, also towards other ranks sharing it.
"""

from __future__ import annotations

import time

from executor.placement import CPU, Placement

__all__ = ["Emulation", "EMULATION_NOTE"]

EMULATION_NOTE = ("emulated heterogeneity: slowdown factor f = busy-wait of (f - 1) x the work of "
                  "each forward/backward on that rank (CPU time on CPU, a spinning kernel on CUDA); "
                  "not a real slower device")


class Emulation:
    def __init__(self, factor: float = 1.0, placement: Placement = CPU):
        if not factor > 0:
            raise ValueError(f"slowdown must be > 0, got {factor}")
        self.factor, self.placement = factor, placement
        self._cycles_per_s: float | None = None
        if placement.cuda and factor > 1.0:
            self._gpu_cycles_per_s()           # now, not inside the first minibatch's stretch

    def clock(self) -> float:
        """Seconds of work so far: the thread's CPU clock, or on CUDA the wall clock once the GPU's
        queued work is done."""
        if not self.placement.cuda:
            return time.thread_time()
        self.placement.synchronize()
        return time.perf_counter()

    def start(self) -> float:
        return self.clock()

    def stretch(self, work_start: float) -> None:
        """Keep the device busy for (factor - 1) x the work since `work_start` (nothing when factor <= 1)."""
        if self.factor <= 1.0:
            return
        now = self.clock()
        target = now + (now - work_start) * (self.factor - 1.0)
        if self.placement.cuda:
            self._spin_gpu(target)
            return
        while time.thread_time() < target:
            pass

    def _spin_gpu(self, target: float) -> None:
        import torch
        while (left := target - time.perf_counter()) > 0:
            torch.cuda._sleep(max(1, int(left * self._gpu_cycles_per_s())))
            self.placement.synchronize()

    def _gpu_cycles_per_s(self) -> float:
        """The spinning kernel's clock rate, measured once (it counts SM clock cycles)."""
        if self._cycles_per_s is None:
            import torch
            cycles = 2_000_000
            torch.cuda._sleep(cycles)                  # first launch loads the kernel
            self.placement.synchronize()
            t0 = time.perf_counter()
            torch.cuda._sleep(cycles)
            self.placement.synchronize()
            self._cycles_per_s = cycles / max(time.perf_counter() - t0, 1e-6)
        return self._cycles_per_s
