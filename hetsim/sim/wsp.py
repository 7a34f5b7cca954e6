"""Wave Synchronous Parallel through parameter servers (HetPipe, ATC'20 §5).

Each stage pushes its wave's aggregated update to every parameter-server shard without waiting; the
push counts towards its virtual worker's clock once it has landed on every shard. Before wave w a
stage pulls global weights, and the pull waits as hetsim.wsp_clock's rule says: until the global
clock is >= w - pull_offset - D, so no virtual worker runs more than D clocks ahead of the slowest.
"""

from __future__ import annotations

import simpy

from hetsim.parameter_servers import Shard, shard_bytes
from hetsim.profile import ModelProfile
from hetsim.sim.pipeline import Stage
from hetsim.sim.recorder import Recorder
from hetsim.sim.world import World
from hetsim.wsp_clock import WaveClocks

__all__ = ["WaveSync"]


class WaveSync:
    """Pushes and pulls as transfers between stages and the shards' hosts; clocks by hetsim.wsp_clock."""

    def __init__(self, world: World, rec: Recorder, profile: ModelProfile, shards: list[Shard],
                 n_stages: list[int], staleness_bound: int, pull_offset: int):
        self.world, self.rec, self.profile, self.shards = world, rec, profile, shards
        self.clocks = WaveClocks(n_stages, staleness_bound, pull_offset)

    @property
    def c_local(self) -> list[int]:
        return self.clocks.c_local

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
        version = stage.pulled.pop(wave, 0)          # wave 0 runs on the initial weights, clock 0
        self.rec.staleness_global.append((stage.vw, stage.index, wave, version, wave - version))
        landed = self.world.env.all_of(self._transfers(stage, to_ps=True))
        landed.callbacks.append(lambda _event: self._landed(stage.vw, wave))

    def _landed(self, vw: int, wave: int) -> None:
        self.clocks.landed(vw, wave)
        for event in self.clocks.released():
            event.succeed()

    def pull(self, stage: Stage, wave: int):
        env, clocks = self.world.env, self.clocks
        start = env.now
        if not clocks.may_pull(wave):
            released = env.event()
            clocks.wait(wave, released)
            yield released
        self.rec.gates.append((stage.vw, stage.index, wave, env.now - start, clocks.c_global))
        version = clocks.c_global
        yield env.all_of(self._transfers(stage, to_ps=False))
        stage.pulled[wave] = version
