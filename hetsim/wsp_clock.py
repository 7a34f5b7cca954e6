"""WSP's clock rule (HetPipe, ATC'20 §5), as pure bookkeeping: who may pull weights for which wave.

A virtual worker's clock c_local counts its waves whose aggregated updates have reached the
parameter servers from every one of its stages, in wave order (a later wave's pushes landing first
do not move it). The global clock c_global is the minimum over virtual workers. The pull before
wave w is answered once c_global >= w - pull_offset - D, so no virtual worker runs more than D
clocks ahead of the slowest.

The simulator (hetsim.sim.wsp), the executor's parameter servers (executor.wsp) and the schedule
validator (hetsim.schedule.validate) all keep their clocks with this class; each decides what a
waiter is (a SimPy event, a rank to answer, a stage of an abstract run).
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["WaveClocks", "pull_needs"]


def pull_needs(wave: int, staleness_bound: int, pull_offset: int) -> int:
    """The global clock the pull before `wave` waits for."""
    return wave - pull_offset - staleness_bound


class WaveClocks:
    """Clocks of virtual workers with `n_stages[v]` pushing stages each, and the pulls waiting on them."""

    def __init__(self, n_stages: Sequence[int], staleness_bound: int, pull_offset: int):
        if staleness_bound < 0 or pull_offset < 0:
            raise ValueError(f"staleness bound {staleness_bound} and pull offset {pull_offset} must be >= 0")
        self.n_stages = list(n_stages)
        self.staleness_bound, self.pull_offset = staleness_bound, pull_offset
        self.c_local = [0] * len(self.n_stages)
        self._arrived: dict[tuple[int, int], int] = {}       # (vw, wave) -> stages whose push landed
        self._waiting: list[tuple[int, object]] = []         # (clock needed, waiter), in arrival order

    @property
    def c_global(self) -> int:
        return min(self.c_local)

    @property
    def waiting(self) -> list:
        """The waiters not released yet, in the order they came."""
        return [waiter for _, waiter in self._waiting]

    def needs(self, wave: int) -> int:
        return pull_needs(wave, self.staleness_bound, self.pull_offset)

    def may_pull(self, wave: int) -> bool:
        return self.c_global >= self.needs(wave)

    def landed(self, vw: int, wave: int) -> None:
        """One stage of `vw` has delivered its push of `wave`; advance the VW's clock over every
        wave now complete, in order."""
        key = (vw, wave)
        self._arrived[key] = self._arrived.get(key, 0) + 1
        while self._arrived.get((vw, self.c_local[vw]), 0) == self.n_stages[vw]:
            del self._arrived[(vw, self.c_local[vw])]
            self.c_local[vw] += 1

    def wait(self, wave: int, waiter) -> None:
        """Hold `waiter` (a pull before `wave`) until `released` hands it back."""
        self._waiting.append((self.needs(wave), waiter))

    def released(self) -> list:
        """The waiters whose pulls the global clock now allows, in the order they came; they stop waiting."""
        now = self.c_global
        ready = [waiter for need, waiter in self._waiting if need <= now]
        self._waiting = [(need, waiter) for need, waiter in self._waiting if need > now]
        return ready
