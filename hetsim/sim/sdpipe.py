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
from hetsim.sim.allreduce import ring_allreduce
from hetsim.sim.pipeline import Stage
from hetsim.sim.world import World

__all__ = ["SemiDecentralisedSync"]


class _UnionFind:
    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, members: list[int]) -> None:
        for m in members[1:]:
            self.parent[self.find(m)] = self.find(members[0])

    def connected(self, among) -> bool:
        return len({self.find(i) for i in among}) <= 1


class _GroupScheduler:
    def __init__(self, world: World, n_vw: int, spec: SyncSpec, groups: list[tuple[int, ...]], waves: int):
        self.world, self.n_vw, self.spec, self.waves = world, n_vw, spec, waves
        self.active = set(range(n_vw))
        self.wait_s = spec.sdpipe_wait_init_s
        self.ready: list[tuple[Stage, int, simpy.Event]] = []
        self.links = _UnionFind(n_vw)
        self.groups = groups                      # every group formed, for the report
        self.connections = 0                      # times the groups since a reset linked everyone
        self._window = 0                          # id of the open window, 0 when none
        self._opened = 0
        self._blocked = False                     # closing waits for arrivals that keep all connected

    def join(self, stage: Stage, wave: int) -> simpy.Event:
        done = self.world.env.event()
        self.ready.append((stage, wave, done))
        if len(self.ready) == len(self.active) or self._blocked:
            self._close()
        elif not self._window:
            self._open()
        return done

    def _open(self) -> None:
        self._opened += 1
        window = self._window = self._opened
        self.world.env.timeout(self.wait_s).callbacks.append(
            lambda _e: self._close() if self._window == window else None)

    def _close(self) -> None:
        members = sorted(self.ready, key=lambda m: m[0].vw)
        vws = [s.vw for s, _, _ in members]
        period_ends = any((wave + 1) % self.spec.sdpipe_period == 0 for _, wave, _ in members)
        if period_ends and len(members) < len(self.active) and not self._would_connect(vws):
            self._blocked = True                  # wait for more pipelines to keep all connected
            return
        self.ready, self._window, self._blocked = [], 0, False
        if len(members) < 2:
            self.wait_s = min(2 * self.wait_s, self.spec.sdpipe_wait_max_s)
        else:
            self.wait_s = max(0.9 * self.wait_s, self.spec.sdpipe_wait_min_s)
        self.links.union(vws)
        if self.links.connected(self.active):
            self.links = _UnionFind(self.n_vw)
            self.connections += 1
        self.active -= {s.vw for s, wave, _ in members if wave == self.waves - 1}
        self.groups.append(tuple(vws))
        self.world.env.process(self._average(members))

    def _would_connect(self, vws: list[int]) -> bool:
        trial = _UnionFind(self.n_vw)
        trial.parent = list(self.links.parent)
        trial.union(vws)
        return trial.connected(self.active)

    def _average(self, members):
        yield from ring_allreduce(self.world, [s.gpu for s, _, _ in members], members[0][0].param_bytes)
        for _, _, done in members:
            done.succeed()


class SemiDecentralisedSync:
    def __init__(self, world: World, n_vw: int, n_stages: int, spec: SyncSpec, waves: int):
        self.groups: list[list[tuple[int, ...]]] = [[] for _ in range(n_stages)]
        self._schedulers = [_GroupScheduler(world, n_vw, spec, self.groups[s], waves)
                            for s in range(n_stages)]

    @property
    def connections(self) -> list[int]:
        return [s.connections for s in self._schedulers]

    def group_sync(self, stage: Stage, wave: int):
        yield self._schedulers[stage.index].join(stage, wave)
