"""BSP synchronisation (Horovod): stage by stage, a ring all-reduce of gradients after every wave."""

from __future__ import annotations

import simpy

from hetsim.sim.collectives import parallel_rings, ring_allreduce
from hetsim.sim.pipeline import Stage
from hetsim.sim.world import World

__all__ = ["ring_allreduce", "BulkSync"]


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
        yield from parallel_rings(self.world, [s.members for s, _ in members], members[0][0].param_bytes)
        for _, done in members:
            done.succeed()
