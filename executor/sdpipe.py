"""SDPipe's semi-decentralised synchronisation over torch.distributed, the protocol
hetsim.sim.sdpipe models (PVLDB 16(9), 2023): the light part is central, the heavy part is not.

- One scheduler rank serves every stage index. A stage that finished a wave (GROUP_SYNC) sends it
  (stage, vw, wave); the scheduler's GroupFormer for that stage index decides the groups on the
  wall clock and tells each member the member list.
- The members then average their weights among themselves with a ring all-reduce of point-to-point
  messages (reduce-scatter, then all-gather), never through the scheduler. Process groups cannot be
  created on the fly without every rank, hence point to point, with a tag per (stage, group number).
- A group of one just continues.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.distributed as dist

from executor.pending import PendingSends
from executor.record import RankRecord
from hetsim.sdpipe_groups import Group, GroupFormer
from hetsim.plan import SyncSpec

__all__ = ["GroupScheduler", "GroupSyncClient", "ring_average"]

_JOIN, _REPLY, _AVERAGE = 5001, 5002, 1 << 20


class GroupScheduler:
    """The scheduler rank's loop: every stage rank joins once per wave."""

    def __init__(self, *, n_vw: int, n_stages: int, spec: SyncSpec, waves: int,
                 stage_rank: Callable[[int, int], int], record: RankRecord):
        self.formers = [GroupFormer(stage=s, n_vw=n_vw, spec=spec, waves=waves) for s in range(n_stages)]
        self.n_vw, self.stage_rank, self.rec = n_vw, stage_rank, record
        self.waves, self.expected = waves, n_vw * n_stages * waves
        self._sends = PendingSends()
        self._where = {stage_rank(v, s): (v, s) for s in range(n_stages) for v in range(n_vw)}

    def serve(self) -> None:
        """A thread per stage rank blocks on that rank's joins and queues them, so the loop wakes at
        an arrival or when a window runs out. (Gloo completes a receive only inside wait(), so it
        cannot be polled; and a receive from one peer fails at once when that peer dies, which one
        from any source does not, so the watchdog can name the dead rank.)"""
        self.rec.waiting_on = sorted(self._where)
        inbox: queue.Queue = queue.Queue()
        for rank in sorted(self._where):
            threading.Thread(target=_receive_joins, args=(rank, self.waves, inbox), daemon=True,
                             name=f"sdpipe-joins-{rank}").start()
        for _ in range(self.expected):
            self._arrival(inbox)
        left = [f"stage {f.stage}: vw {sorted(f.ready)}" for f in self.formers if f.ready]
        if left:
            raise RuntimeError(f"sdpipe scheduler: groups never formed for {left}")
        self._sends.wait_all()
        self.rec.groups = [(g.stage, g.number, g.members, g.waves) for f in self.formers for g in f.groups]
        self.rec.connections = [f.connections for f in self.formers]

    def _arrival(self, inbox: queue.Queue) -> None:
        """Wait for the next join, closing the windows that run out meanwhile; then hand it on."""
        while True:
            deadlines = [f.deadline for f in self.formers if f.deadline is not None]
            try:
                item = inbox.get(timeout=max(0.0, min(deadlines) - time.perf_counter()) if deadlines else None)
            except queue.Empty:
                item = None
            now = time.perf_counter()
            if isinstance(item, _Failed):
                self.rec.waiting_on = self._suspects(item.rank)
                raise RuntimeError(f"receiving a join: {item.error}") from item.error
            if item is not None:
                stage, vw, wave = item
                self.rec.at(f"join s{stage} vw{vw} wave{wave}")
                self._announce(self.formers[stage].join(vw, wave, now))
            for f in self.formers:
                self._announce(f.expire(now))
            if item is not None:
                return

    def _suspects(self, rank: int) -> list[int]:
        """Whom a failed receive from `rank` waited on: the rank itself, unless it is waiting for
        its group (its silence is then expected), when it is the VWs that group still waits for."""
        vw, stage = self._where[rank]
        former = self.formers[stage]
        if vw not in former.ready:
            return [rank]
        missing = sorted(former.active - set(former.ready))
        return [self.stage_rank(v, stage) for v in missing] or sorted(self._where)

    def _announce(self, group: Group | None) -> None:
        if group is None:
            return
        reply = torch.full((2 + self.n_vw,), -1, dtype=torch.long)
        reply[0], reply[1] = group.number, len(group.members)
        reply[2:2 + len(group.members)] = torch.tensor(group.members)
        for vw in group.members:
            self._sends.add(dist.isend(reply, self.stage_rank(vw, group.stage), tag=_REPLY))


@dataclass(frozen=True)
class _Failed:
    rank: int                 # whose joins could not be received
    error: Exception


def _receive_joins(rank: int, count: int, inbox: queue.Queue) -> None:
    """(stage, vw, wave) of each of `rank`'s joins into `inbox`, or a _Failed when a receive fails."""
    try:
        for _ in range(count):
            message = torch.zeros(3, dtype=torch.long)
            dist.recv(message, rank, tag=_JOIN)
            inbox.put(tuple(int(x) for x in message))
    except Exception as exc:                   # that peer died or went silent: the loop raises it
        inbox.put(_Failed(rank, exc))


class GroupSyncClient:
    """A stage's side of GROUP_SYNC. `peers[v]` is the rank of this stage index in VW v."""

    def __init__(self, *, vw: int, stage: int, n_stages: int, scheduler_rank: int, peers: list[int],
                 record: RankRecord):
        self.vw, self.stage, self.n_stages = vw, stage, n_stages
        self.scheduler, self.peers, self.rec = scheduler_rank, peers, record

    def sync(self, wave: int, flat: Callable[[], torch.Tensor]) -> tuple[tuple[int, ...], torch.Tensor | None]:
        """Join the wave's group; returns its members and the averaged weights (None for a group of one)."""
        # The scheduler waits on the same stage of the other VWs: a dead one is named before it.
        self.rec.waiting_on = [p for p in self.peers if p != self.peers[self.vw]] + [self.scheduler]
        dist.send(torch.tensor([self.stage, self.vw, wave]), self.scheduler, tag=_JOIN)
        reply = torch.empty(2 + len(self.peers), dtype=torch.long)
        dist.recv(reply, self.scheduler, tag=_REPLY)
        number, size = int(reply[0]), int(reply[1])
        members = tuple(int(m) for m in reply[2:2 + size])
        if size < 2:
            return members, None
        ranks = [self.peers[m] for m in members]
        self.rec.waiting_on = [r for r in ranks if r != self.peers[self.vw]]
        weights = flat()
        ring_average(weights, ranks, members.index(self.vw), tag=_AVERAGE + number * self.n_stages + self.stage)
        return members, weights


def ring_average(flat: torch.Tensor, ranks: list[int], me: int, *, tag: int) -> None:
    """Average `flat` in place across `ranks` (this rank is ranks[me]): a ring reduce-scatter, then
    an all-gather, 2(k-1) steps of 1/k of the vector each, as hetsim.sim.allreduce.ring_allreduce
    costs it. Every member sums each chunk in the same order, so all end bit-identical."""
    k = len(ranks)
    chunks = list(flat.tensor_split(k))
    right, left = ranks[(me + 1) % k], ranks[(me - 1) % k]

    def exchange(send: int, recv: int, add: bool) -> None:
        works = [dist.isend(chunks[send], right, tag=tag)] if chunks[send].numel() else []
        if chunks[recv].numel():
            incoming = torch.empty_like(chunks[recv])
            dist.recv(incoming, left, tag=tag)
            chunks[recv].add_(incoming) if add else chunks[recv].copy_(incoming)
        for w in works:
            w.wait()

    for t in range(k - 1):                  # after this, chunk me+1 holds the sum of all members
        exchange((me - t) % k, (me - t - 1) % k, add=True)
    chunks[(me + 1) % k].div_(k)
    for t in range(k - 1):
        exchange((me + 1 - t) % k, (me - t) % k, add=False)
