"""SDPipe's semi-decentralised synchronisation (PVLDB 16(9), 2023).

Per stage index, a lightweight central scheduler forms groups among the pipelines that are ready;
each group averages its weights with a decentralised ring all-reduce. The first ready worker opens a
waiting window; the group is whoever is ready when it closes (or when all have arrived). The window
doubles after a group of one (up to a maximum) and shrinks by 0.9 otherwise. Connectivity rule: the
groups formed since the last reset must connect all pipelines before any worker finishes a period of
P waves; P = 1 is plain all-reduce. A pipeline that has run its last wave leaves the rule, so
the others can finish (the real system trains without end; a simulation stops).
"""

from __future__ import annotations

import simpy

from hetsim.plan import SyncSpec
from hetsim.sdpipe_groups import GroupFormer
from hetsim.sim.allreduce import ring_allreduce
from hetsim.sim.pipeline import Stage
from hetsim.sim.world import World

__all__ = ["SemiDecentralisedSync"]


class _GroupScheduler:
    """One stage index's central scheduler: hetsim.sdpipe_groups decides the groups (the executor's
    scheduler rank uses the same rules); this keeps the window's clock and averages each group."""

    def __init__(self, world: World, n_vw: int, spec: SyncSpec, groups: list[tuple[int, ...]], waves: int,
                 stage_index: int):
        self.world = world
        self.former = GroupFormer(stage=stage_index, n_vw=n_vw, spec=spec, waves=waves)
        self.groups = groups                      # every group formed, for the report
        self.waiting: dict[int, tuple[Stage, simpy.Event]] = {}

    @property
    def connections(self) -> int:
        return self.former.connections

    def join(self, stage: Stage, wave: int) -> simpy.Event:
        done = self.world.env.event()
        self.waiting[stage.vw] = (stage, done)
        closed_before = self.former.deadline is None
        self._formed(self.former.join(stage.vw, wave, self.world.env.now))
        if closed_before and self.former.deadline is not None:
            self._arm(self.former.deadline)
        return done

    def _arm(self, deadline: float) -> None:
        def expire(_event):
            if self.former.deadline == deadline:          # still this window
                self._formed(self.former.expire(self.world.env.now))
        self.world.env.timeout(deadline - self.world.env.now).callbacks.append(expire)

    def _formed(self, group) -> None:
        if group is None:
            return
        self.groups.append(group.members)
        members = [self.waiting.pop(vw) for vw in group.members]
        self.world.env.process(self._average(members))

    def _average(self, members):
        yield from ring_allreduce(self.world, [s.gpu for s, _ in members], members[0][0].param_bytes)
        for _, done in members:
            done.succeed()


class SemiDecentralisedSync:
    def __init__(self, world: World, n_vw: int, n_stages: int, spec: SyncSpec, waves: int):
        self.groups: list[list[tuple[int, ...]]] = [[] for _ in range(n_stages)]
        self._schedulers = [_GroupScheduler(world, n_vw, spec, self.groups[s], waves, s)
                            for s in range(n_stages)]

    @property
    def connections(self) -> list[int]:
        return [s.connections for s in self._schedulers]

    def group_sync(self, stage: Stage, wave: int):
        yield self._schedulers[stage.index].join(stage, wave)
