"""Wave Synchronous Parallel through parameter servers (HetPipe, ATC'20 §5).

A virtual worker's clock c_local counts its waves whose aggregated updates have reached every
parameter-server shard; the global clock c_global is the minimum over virtual workers. Before wave w
a stage pulls global weights, and the pull waits until c_global >= w - pull_offset - D: no virtual
worker runs more than D clocks ahead of the slowest.
"""

from __future__ import annotations

import simpy

from hetsim.parameter_servers import Shard, shard_bytes
from hetsim.profile import ModelProfile
from hetsim.sim.pipeline import Stage
from hetsim.sim.recorder import Recorder
from hetsim.sim.world import World

__all__ = ["WaveSync"]


class WaveSync:
    def __init__(self, world: World, rec: Recorder, profile: ModelProfile, shards: list[Shard],
                 n_vw: int, n_stages: list[int], staleness_bound: int, pull_offset: int):
        self.world, self.rec, self.profile, self.shards = world, rec, profile, shards
        self.D, self.offset = staleness_bound, pull_offset
        self.c_local = [0] * n_vw
        self.c_global = 0
        self._n_stages = n_stages
        self._arrived: dict[tuple[int, int], int] = {}       # (vw, wave) -> stages whose push landed
        self._waiting: list[tuple[int, simpy.Event]] = []    # (clock needed, event)

    def _transfers(self, stage: Stage, to_ps: bool) -> list[simpy.Event]:
        events = []
        for shard in self.shards:
            nbytes = shard_bytes(self.profile, shard, *stage.layers)
            if nbytes:
                host = self.world.host(shard.node)
                src, dst = (stage.gpu, host) if to_ps else (host, stage.gpu)
                events.append(self.world.transfer(src, dst, nbytes))
        return events

    def push(self, stage: Stage, wave: int) -> None:
        """Send this stage's share of the wave's aggregated update; the stage does not wait. (Unlike
        a pipeline send, the push does not occupy a rank sharing cores: the server posts its receive
        only after the push's header arrives, so gloo's isend returns at once and its own thread
        writes the update later.)"""
        self.rec.staleness_global.append((stage.vw, stage.index, wave, stage.version, wave - stage.version))
        landed = self.world.env.all_of(self._transfers(stage, to_ps=True))
        landed.callbacks.append(lambda _event: self._landed(stage.vw, wave))

    def _landed(self, vw: int, wave: int) -> None:
        key = (vw, wave)
        self._arrived[key] = self._arrived.get(key, 0) + 1
        # Clocks advance in wave order even if a later wave's pushes land first.
        while self._arrived.get((vw, self.c_local[vw]), 0) == self._n_stages[vw]:
            del self._arrived[(vw, self.c_local[vw])]
            self.c_local[vw] += 1
        self.c_global = min(self.c_local)
        ready = [e for need, e in self._waiting if need <= self.c_global]
        self._waiting = [(need, e) for need, e in self._waiting if need > self.c_global]
        for event in ready:
            event.succeed()

    def pull(self, stage: Stage, wave: int):
        env = self.world.env
        need, start = wave - self.offset - self.D, env.now
        if self.c_global < need:
            released = env.event()
            self._waiting.append((need, released))
            yield released
        self.rec.gates.append((stage.vw, stage.index, wave, env.now - start, self.c_global))
        version = self.c_global
        yield env.all_of(self._transfers(stage, to_ps=False))
        stage.version = version
