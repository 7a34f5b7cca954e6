"""Ring all-reduce (as in Horovod) and BSP synchronisation built on it."""

from __future__ import annotations

import simpy

from hetsim.sim.pipeline import Stage
from hetsim.sim.world import World

__all__ = ["ring_allreduce", "BulkSync"]


def ring_allreduce(world: World, gpus: list[str], nbytes: float):
    """2(n-1) steps; in each, every member sends nbytes/n to its ring successor at the same time."""
    n = len(gpus)
    if n < 2 or nbytes <= 0:
        return
    chunk = nbytes / n
    for _ in range(2 * (n - 1)):
        yield world.env.all_of([world.transfer(gpus[i], gpus[(i + 1) % n], chunk) for i in range(n)])


class BulkSync:
    """BSP: after every wave, stage s of every VW all-reduces its gradients, then all step together."""

    def __init__(self, world: World, n_vw: int):
        self.world, self.n_vw = world, n_vw
        self._joined: dict[tuple[int, int], list[tuple[Stage, simpy.Event]]] = {}

    def allreduce(self, stage: Stage, wave: int):
        key = (stage.index, wave)
        done = self.world.env.event()
        members = self._joined.setdefault(key, [])
        members.append((stage, done))
        if len(members) == self.n_vw:
            del self._joined[key]
            self.world.env.process(self._run(members))
        yield done

    def _run(self, members: list[tuple[Stage, simpy.Event]]):
        members = sorted(members, key=lambda m: m[0].vw)
        yield from ring_allreduce(self.world, [s.gpu for s, _ in members], members[0][0].param_bytes)
        for _, done in members:
            done.succeed()
