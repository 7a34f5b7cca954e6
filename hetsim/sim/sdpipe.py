"""SDPipe's semi-decentralised synchronisation (PVLDB 16(9), 2023).

Per stage index, a lightweight central scheduler forms groups among the pipelines that are ready;
each group averages its weights with a decentralised ring all-reduce. The first ready worker opens a
waiting window; the group is whoever is ready when it closes (or when all have arrived). The window
doubles after a group of one (up to a maximum) and shrinks by 0.9 otherwise. Connectivity rule: the
groups must connect all pipelines at least once in every period of P waves of each pipeline
(hetsim.sdpipe_groups); P = 1 is plain all-reduce. A pipeline that has run its last wave leaves the rule, so
the others can finish (the real system trains without end; a simulation stops).

What a group costs besides the ring (as executor.sdpipe runs it): the join and the reply are messages
between the stage and the scheduler process (on the first parameter-server node's host; latency and
copies as any message), and each member of a group of two or more makes its own passes over the
stage's weights: flattening them into one vector before the ring, and after it adding the k - 1
incoming chunks, dividing its own and copying in the k - 1 gathered ones, 1 + (2(k - 1) + 1)/k
passes of |w| in all. Ranks sharing a node's cores do them at the node's measured copy rate (the rate
World charges a message's copies at), a GPU at its memory bandwidth.
"""

from __future__ import annotations

import simpy

from hetsim.plan import SyncSpec
from hetsim.sdpipe_groups import GroupFormer
from hetsim.sim.allreduce import ring_allreduce
from hetsim.sim.pipeline import Stage
from hetsim.sim.world import World

__all__ = ["SemiDecentralisedSync", "JOIN_BYTES", "reply_bytes", "averaging_passes"]

JOIN_BYTES = 3 * 8                      # (stage, vw, wave) as int64


def reply_bytes(n_vw: int) -> int:
    """The scheduler's answer: group number, size and up to n_vw member indices, as int64."""
    return (2 + n_vw) * 8


def averaging_passes(k: int) -> float:
    """Passes over |w| a member of a group of k makes besides the ring's messages (module docstring)."""
    return 1.0 + (2 * (k - 1) + 1) / k if k > 1 else 0.0


class _GroupScheduler:
    """One stage index's central scheduler: hetsim.sdpipe_groups decides the groups (the executor's
    scheduler rank uses the same rules); this keeps the window's clock and averages each group."""

    def __init__(self, world: World, n_vw: int, spec: SyncSpec, groups: list[tuple[int, ...]], waves: int,
                 stage_index: int, host: str):
        self.world, self.n_vw, self.host = world, n_vw, host
        self.former = GroupFormer(stage=stage_index, n_vw=n_vw, spec=spec, waves=waves)
        self.groups = groups                      # every group formed, for the report
        self.waiting: dict[int, tuple[Stage, simpy.Event]] = {}

    @property
    def connections(self) -> int:
        return self.former.connections

    def join(self, stage: Stage, wave: int) -> simpy.Event:
        """The stage sends (stage, vw, wave) to the scheduler; the event fires when its group is done."""
        done = self.world.env.event()
        sent = self.world.transfer(stage.gpu, self.host, JOIN_BYTES)
        sent.callbacks.append(lambda _event: self._arrived(stage, wave, done))
        return done

    def _arrived(self, stage: Stage, wave: int, done: simpy.Event) -> None:
        self.waiting[stage.vw] = (stage, done)
        closed_before = self.former.deadline is None
        self._formed(self.former.join(stage.vw, wave, self.world.env.now))
        if closed_before and self.former.deadline is not None:
            self._arm(self.former.deadline)

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
        env = self.world.env
        yield env.all_of([self.world.transfer(self.host, s.gpu, reply_bytes(self.n_vw)) for s, _ in members])
        if len(members) > 1:
            gpus, nbytes = [s.gpu for s, _ in members], members[0][0].param_bytes
            yield env.all_of([_passes(self.world, g, nbytes) for g in gpus])                 # flatten
            yield from ring_allreduce(self.world, gpus, nbytes)
            yield env.all_of([_passes(self.world, g, (averaging_passes(len(gpus)) - 1) * nbytes) for g in gpus])
        for _, done in members:
            done.succeed()


def _passes(world: World, gpu: str, nbytes: float) -> simpy.Event:
    """A member's own elementwise work over `nbytes` (see the module docstring for the rates)."""
    slot = world.cluster.gpu(gpu)
    node = world.cluster.node(slot.node)
    if node.shared_cores:
        # Work of that rank's one thread on the node's shared cores, as its compute is charged (not
        # on copy_cores: on ranks sharing a GPU these passes are kernels on that GPU, not host copies).
        return world.cores.transfer((f"{node.name}:cores", f"{gpu}:io"), nbytes / node.intra_link.bandwidth_Bps)
    return world.env.timeout(nbytes / slot.type.memory_bandwidth_Bps)


class SemiDecentralisedSync:
    def __init__(self, world: World, n_vw: int, n_stages: int, spec: SyncSpec, waves: int):
        self.groups: list[list[tuple[int, ...]]] = [[] for _ in range(n_stages)]
        # The scheduler is a CPU process; the executor starts it beside the parameter servers.
        host = world.host(world.cluster.ps_nodes[0] if world.cluster.ps_nodes else world.cluster.nodes[0].name)
        self._schedulers = [_GroupScheduler(world, n_vw, spec, self.groups[s], waves, s, host)
                            for s in range(n_stages)]

    @property
    def connections(self) -> list[int]:
        return [s.connections for s in self._schedulers]

    def group_sync(self, stage: Stage, wave: int):
        yield self._schedulers[stage.index].join(stage, wave)
