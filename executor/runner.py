"""A stage rank replays its list of hetsim schedule actions; the simulator's twin is hetsim.sim.pipeline.

Each action kind has a small handler. Sends are asynchronous (isend); receives are posted ahead
and RECV waits for its message, so a message travels as soon as it is sent, as the simulator
assumes; time spent waiting is recorded as such, forwards/backwards as compute.

A tensor-parallel stage is one StageRank per member, all replaying the stage's actions. Only the
lead talks to the neighbouring stages (as hetsim.sim.pipeline's stage does from its GPU): at RECV it
broadcasts what it received to the other members, who wait for that broadcast instead; their
outputs and input gradients equal the lead's (modelzoo.tp), so only the lead sends them. The
all-reduces inside a forward or backward are recorded as "tp" spans within its compute span.
"""

from __future__ import annotations

import os
import time
from collections import deque

import torch
import torch.distributed as dist

from executor.data import SyntheticData
from executor.emulation import Emulation
from executor.pending import PendingSends
from executor.placement import CPU, Placement
from executor.record import RankRecord
from executor.sdpipe import GroupSyncClient
from executor.stage import StageModel
from executor.wsp import WspClient
from modelzoo.tp import TPComm

__all__ = ["StageRank"]


class StageRank:
    def __init__(self, *, vw: int, stage: int, n_stages: int, nm: int, asynchronous: bool,
                 model: StageModel, data: SyntheticData, in_shapes: list[tuple[int, ...]],
                 out_shapes: list[tuple[int, ...]], prev_rank: int | None, next_rank: int | None,
                 emulation: Emulation, record: RankRecord, wsp: WspClient | None = None,
                 group=None, group_ranks: list[int] | None = None, n_vw: int = 1,
                 checkpoint=None, fault: tuple[int, str, str] | None = None, rank: int = -1,
                 sdpipe: GroupSyncClient | None = None, placement: Placement = CPU,
                 p2p_groups: dict[tuple[int, int], object] | None = None, tp: TPComm | None = None,
                 tp_ranks: list[int] | None = None):
        self.vw, self.stage, self.n_stages, self.nm = vw, stage, n_stages, nm
        self.asynchronous = asynchronous
        self.model, self.data, self.emulation, self.rec = model, data, emulation, record
        self.in_shapes, self.out_shapes = in_shapes, out_shapes
        self.prev_rank, self.next_rank = prev_rank, next_rank
        self.wsp, self.group, self.group_ranks, self.n_vw = wsp, group, group_ranks or [], n_vw
        self.sdpipe = sdpipe
        self.placement = placement
        # NCCL: one communicator per direction of each link (see executor.worker._p2p_groups).
        self.p2p_groups = p2p_groups or {}
        self.checkpoint = checkpoint          # callable(wave) after each STEP, or None
        self.rank, self.fault = rank, fault
        self.tp, self.tp_ranks = tp, tp_ranks or []   # a tensor-parallel stage's group, its ranks lead first
        self.lead = tp is None or tp.rank == 0
        self.applied = 0                  # own minibatches whose updates are in the local weights
        self._received: dict[tuple[str, int], tuple[torch.Tensor, ...]] = {}
        self._outbox: dict[tuple[str, int], tuple[torch.Tensor, ...]] = {}
        self._sends = PendingSends()
        self._posted: dict[tuple[str, int], tuple] = {}    # (kind, mb) -> (src, tensors, irecv works)
        self._pending_recvs: deque[tuple[str, int]] = deque()

    def run(self, actions, start: int = 0) -> None:
        """Replay actions[start:] (start > 0 when resuming from a checkpoint)."""
        self._pending_recvs = deque((kind, index) for kind, index in actions[start:]
                                    if kind in _RECV_FROM and self.lead)
        self._post_recvs()
        for kind, index in actions[start:]:
            self.rec.at(f"{kind}{index}")
            if self.fault is not None and self.fault[:2] == (self.rank, f"{kind}{index}"):
                _inject(self.fault[2])
            _HANDLERS[kind](self, index)
        self.rec.at("done")
        self._sends.wait_all()
        if self.wsp is not None:
            self.wsp.finish()

    # compute -----------------------------------------------------------------------------------
    def _compute(self, name: str, fn, cat: str = "compute"):
        work0 = self.emulation.start()       # on CUDA, after the copies queued before it
        t0 = time.perf_counter()
        out = fn()
        work1 = self.emulation.clock()       # on CUDA, once the GPU has done the work
        self.emulation.stretch(work0)
        t1 = time.perf_counter()
        self.rec.span(name, cat, t0, t1)
        self.rec.work.append((t1, name, work1 - work0))   # the work itself, without emulation (or preemption on CPU)
        if self.tp is not None:
            for a, b in self.tp.drain():
                self.rec.span(f"tp {name}", "tp", a, b)
        return out

    def forward(self, mb: int) -> None:
        last = self.stage == self.n_stages - 1
        inputs = ((self.data.inputs(self.vw, mb).to(self.placement.compute),) if self.stage == 0
                  else self._received.pop(("F", mb)))
        labels = self.data.labels(self.vw, mb).to(self.placement.compute) if last else None
        expected = mb if self.asynchronous else mb - mb % self.nm
        if self.lead:                        # a stage's records, once per stage as the simulator's
            self.rec.staleness_local.append((self.vw, self.stage, mb, expected - self.applied))
        outputs = self._compute(f"F{mb}", lambda: self.model.forward(mb, inputs, labels))
        if not self.lead:
            return
        if last:
            self.rec.losses.append((self.vw, mb, self.model.loss_of(mb)))
        else:
            self._outbox[("F", mb)] = outputs

    def backward(self, mb: int) -> None:
        grads = None if self.stage == self.n_stages - 1 else self._received.pop(("B", mb))

        def run():
            out = self.model.backward(mb, grads, need_input_grads=self.stage > 0)
            if not self.asynchronous:
                self.model.accumulate(mb)
            return out
        grad_inputs = self._compute(f"B{mb}", run)
        if not self.lead:
            return
        if self.stage > 0:
            self._outbox[("B", mb)] = grad_inputs
        else:
            self.rec.completions.append(time.perf_counter())

    # point to point ------------------------------------------------------------------------------
    def _send(self, kind: str, mb: int, dst: int) -> None:
        if not self.lead:
            return
        group = self.p2p_groups.get((self.rank, dst))
        for j, tensor in enumerate(self._outbox.pop((kind, mb))):
            self._sends.add(dist.isend(self.placement.to_wire(tensor.contiguous()), dst, tag=mb * 16 + j,
                                       group=group))

    def _post_recvs(self) -> None:
        """Keep the next RECV_LOOKAHEAD receives posted, so a message travels as soon as it is sent
        (gloo and NCCL move a point-to-point message only once its receive is posted; PipeDream's
        runtime posts them ahead the same way), as the simulator's transfers do."""
        while len(self._posted) < RECV_LOOKAHEAD and self._pending_recvs:
            action, mb = self._pending_recvs.popleft()
            kind, (src, shapes) = action[-1], _RECV_FROM[action](self)
            tensors = tuple(self.placement.empty(shape) for shape in shapes)
            group = self.p2p_groups.get((src, self.rank))
            works = [dist.irecv(t, src, tag=mb * 16 + j, group=group) for j, t in enumerate(tensors)]
            self._posted[(kind, mb)] = (src, tensors, works)

    def _recv(self, kind: str, mb: int) -> None:
        if not self.lead:
            self._recv_from_lead(kind, mb)
            return
        t0 = time.perf_counter()
        src, tensors, works = self._posted.pop((kind, mb))
        # Refill before waiting (so RECV_LOOKAHEAD receives besides this one are posted meanwhile):
        # posting an irecv sometimes blocks for milliseconds (median 66 us, mean 1 ms, max 5 ms in a
        # 2-stage 1F1B on 2 cores), and here that overlaps the wait instead of delaying the compute
        # after it (+26% samples/s in that case).
        self._post_recvs()
        self.rec.waiting_on = [src]
        for work in works:
            work.wait()                      # NCCL: only makes this rank's stream wait for the message
        if self.tp is not None:
            self.rec.waiting_on = self.tp_ranks[1:]
            for t in tensors:                # to the other members (_recv_from_lead)
                dist.broadcast(t, src=self.rank, group=self.tp.group)
        self._received[(kind, mb)] = tuple(self.placement.from_wire(t) for t in tensors)
        self.placement.synchronize()         # so the message's arrival is waiting, not the next compute
        self.rec.span(f"wait {kind}{mb}", "wait", t0, time.perf_counter())

    def _recv_from_lead(self, kind: str, mb: int) -> None:
        """A tensor-parallel member: what the lead received, by a broadcast in the group."""
        t0 = time.perf_counter()
        _, shapes = _RECV_FROM[f"RECV_{kind}"](self)
        tensors = tuple(self.placement.empty(shape) for shape in shapes)
        self.rec.waiting_on = self.tp_ranks[:1]
        for t in tensors:
            dist.broadcast(t, src=self.tp_ranks[0], group=self.tp.group)
        self._received[(kind, mb)] = tuple(self.placement.from_wire(t) for t in tensors)
        self.placement.synchronize()
        self.rec.span(f"wait {kind}{mb}", "wait", t0, time.perf_counter())

    # optimiser and synchronisation ----------------------------------------------------------------
    def _changed(self, wave: int, name: str, change) -> None:
        """Apply a weight change; under WSP remember it as part of the wave's update to push.
        Optimiser time is its own category: the simulator counts only forwards and backwards."""
        def apply():
            deltas = change()
            if self.wsp is not None:
                self.wsp.record(wave, deltas)
        self._compute(name, apply, "optimizer")

    def update(self, mb: int) -> None:
        self._changed(mb // self.nm, f"U{mb}", lambda: self.model.update(mb))
        self.applied = mb + 1

    def step(self, wave: int) -> None:
        self._changed(wave, f"STEP{wave}", self.model.step)
        self.applied = (wave + 1) * self.nm
        if self.checkpoint is not None:
            self.checkpoint(wave)

    def push(self, wave: int) -> None:
        t0 = time.perf_counter()
        version = self.wsp.version
        self.rec.staleness_global.append((self.vw, self.stage, wave, version, wave - version))
        self.wsp.push(wave)
        self.rec.span(f"push {wave}", "sync", t0, time.perf_counter())

    def pull(self, wave: int) -> None:
        t0 = time.perf_counter()
        self.rec.waiting_on = list(self.wsp.ps_ranks)
        weights, clock, held = self.wsp.pull(wave, self.model.flat, self.model.numel)
        self.model.set_flat(weights)
        t1 = time.perf_counter()
        self.rec.gates.append((self.vw, self.stage, wave, held, clock))
        self.rec.span(f"pull {wave}", "sync", t0, t1)

    def allreduce(self, wave: int) -> None:
        """BSP: average the wave's gradients with the same stage of every VW (ring all-reduce in gloo)."""
        t0 = time.perf_counter()
        self.rec.waiting_on = self.group_ranks
        flat = self.model.wave_flat()
        wire = self.placement.to_wire(flat)
        dist.all_reduce(wire, group=self.group)
        if wire is not flat:
            flat.copy_(wire)
        self.placement.synchronize()         # NCCL: the host goes on at once; the wait belongs here
        self.model.scale_wave(1.0 / self.n_vw)
        self.rec.span(f"allreduce {wave}", "sync", t0, time.perf_counter())

    def group_sync(self, wave: int) -> None:
        """SDPipe: average the weights with the group the scheduler forms (a group of one goes on)."""
        t0 = time.perf_counter()
        members, weights = self.sdpipe.sync(wave, lambda: self.model.flat().cpu())   # via the host
        if weights is not None:
            self.model.set_flat(weights.to(self.placement.compute))
        self.rec.span(f"group {wave} {'+'.join(f'vw{m}' for m in members)}", "sync", t0, time.perf_counter())


RECV_LOOKAHEAD = 2
# Where each kind of receive comes from and the shapes it brings.
_RECV_FROM = {"RECV_F": lambda r: (r.prev_rank, r.in_shapes), "RECV_B": lambda r: (r.next_rank, r.out_shapes)}


def _inject(kind: str) -> None:
    """Testing: this rank dies (exits without a word) or hangs (never returns)."""
    if kind == "die":
        os._exit(1)
    while True:
        time.sleep(1.0)


_HANDLERS = {
    "F": StageRank.forward, "B": StageRank.backward,
    "SEND_F": lambda r, mb: r._send("F", mb, r.next_rank),
    "SEND_B": lambda r, mb: r._send("B", mb, r.prev_rank),
    "RECV_F": lambda r, mb: r._recv("F", mb),
    "RECV_B": lambda r, mb: r._recv("B", mb),
    "UPDATE": StageRank.update, "STEP": StageRank.step, "PUSH": StageRank.push, "PULL": StageRank.pull,
    "ALLREDUCE": StageRank.allreduce, "GROUP_SYNC": StageRank.group_sync,
}
