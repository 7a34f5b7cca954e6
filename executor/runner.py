"""A stage rank replays its list of hetsim schedule actions; the simulator's twin is hetsim.sim.pipeline.

Each action kind has a small handler. Sends are asynchronous (isend); receives are posted ahead
and RECV waits for its message, so a message travels as soon as it is sent, as the simulator
assumes; time spent waiting is recorded as such, forwards/backwards as compute. Under a rendezvous
schedule (DeepSpeed's engine) a receive is posted only when reached and a send waits until received.

A tensor-parallel stage is one StageRank per member, all replaying the stage's actions. Only the
lead talks to the neighbouring stages (as hetsim.sim.pipeline's stage does from its GPU): at RECV it
broadcasts what it received to the other members, who wait for that broadcast instead; their
outputs and input gradients equal the lead's (modelzoo.tp), so only the lead sends them. The
all-reduces inside a forward or backward are recorded as "tp" spans within its compute span.

Under interleaved schedules a rank is a device running several model chunks (virtual stages); each
action names its chunk, and messages are tagged by kind, minibatch and receiving virtual stage, since
two devices may exchange activations and gradients of several chunks. Zero-bubble schedules run a
backward as I (input gradient, sent on at once) and, later, W (weight gradient).
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass, field

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

__all__ = ["StageRank", "Chunk"]


@dataclass
class Chunk:
    """A model chunk a rank runs: its stage (one per rank, unless the schedule has virtual stages)."""

    stage: int                              # virtual stage index in the VW's pipeline
    model: StageModel
    in_shapes: list[tuple[int, ...]]
    out_shapes: list[tuple[int, ...]]
    prev_rank: int | None
    next_rank: int | None
    group: object = None                    # BSP: the all-reduce group of this stage across VWs
    group_ranks: list[int] = field(default_factory=list)


class StageRank:
    def __init__(self, *, vw: int, n_stages: int, nm: int, asynchronous: bool, chunks: list[Chunk],
                 data: SyntheticData, emulation: Emulation, record: RankRecord, wsp: WspClient | None = None,
                 n_vw: int = 1, checkpoint=None, fault: tuple[int, str, str] | None = None, rank: int = -1,
                 sdpipe: GroupSyncClient | None = None, placement: Placement = CPU,
                 p2p_groups: dict[tuple[int, int], object] | None = None, tp: TPComm | None = None,
                 tp_ranks: list[int] | None = None, rendezvous: bool = False):
        self.vw, self.n_stages, self.nm = vw, n_stages, nm
        # DeepSpeed's engine: a receive is posted when reached and a send waits until it is received.
        self.rendezvous = rendezvous
        self.asynchronous = asynchronous
        self.chunks = chunks
        # Asynchronous schedules, WSP and SDPipe run one chunk: theirs is chunks[0].
        self.stage, self.model = chunks[0].stage, chunks[0].model
        self.data, self.emulation, self.rec = data, emulation, record
        self.wsp, self.n_vw = wsp, n_vw
        self.sdpipe = sdpipe
        self.placement = placement
        # NCCL: one communicator per direction of each link (see executor.worker._p2p_groups).
        self.p2p_groups = p2p_groups or {}
        self.checkpoint = checkpoint          # callable(wave) after each STEP, or None
        self.rank, self.fault = rank, fault
        self.tp, self.tp_ranks = tp, tp_ranks or []   # a tensor-parallel stage's group, its ranks lead first
        self.lead = tp is None or tp.rank == 0
        self.applied = 0                  # own minibatches whose updates are in the local weights
        # WSP: the global clock pulled for each wave not yet pushed (a 1F1B stage pulls w + 1 before
        # it pushes w; the update of w is as stale as the weights its forwards ran on).
        self._pulled: dict[int, int] = {}
        self._received: dict[tuple[str, int, int], tuple[torch.Tensor, ...]] = {}    # (kind, mb, chunk)
        self._outbox: dict[tuple[str, int, int], tuple[torch.Tensor, ...]] = {}
        self._sends = PendingSends()
        self._posted: dict[tuple[str, int, int], tuple] = {}    # (kind, mb, chunk) -> (src, tensors, works)
        self._pending_recvs: deque[tuple[str, int, int]] = deque()

    def run(self, actions, start: int = 0) -> None:
        """Replay actions[start:] (start > 0 when resuming from a checkpoint)."""
        self._pending_recvs = deque(tuple(a) for a in actions[start:] if a.kind in _RECV_FROM and self.lead)
        if not self.rendezvous:
            self._post_recvs()
        for action in actions[start:]:
            self.rec.at(str(action))
            if self.fault is not None and self.fault[:2] == (self.rank, str(action)):
                _inject(self.fault[2])
            _HANDLERS[action.kind](self, action.index, action.chunk)
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

    def forward(self, mb: int, c: int = 0) -> None:
        chunk = self.chunks[c]
        last = chunk.stage == self.n_stages - 1
        inputs = ((self.data.inputs(self.vw, mb).to(self.placement.compute),) if chunk.stage == 0
                  else self._received.pop(("F", mb, c)))
        labels = self.data.labels(self.vw, mb).to(self.placement.compute) if last else None
        expected = mb if self.asynchronous else mb - mb % self.nm
        if self.lead:                        # a stage's records, once per stage as the simulator's
            self.rec.staleness_local.append((self.vw, chunk.stage, mb, expected - self.applied))
        outputs = self._compute(f"F{mb}", lambda: chunk.model.forward(mb, inputs, labels))
        if not self.lead:
            return
        if last:
            self.rec.losses.append((self.vw, mb, chunk.model.loss_of(mb)))
            self.rec.loss_times.append(time.perf_counter())
        else:
            self._outbox[("F", mb, c)] = outputs

    def backward(self, mb: int, c: int = 0) -> None:
        chunk = self.chunks[c]
        grads = None if chunk.stage == self.n_stages - 1 else self._received.pop(("B", mb, c))

        def run():
            out = chunk.model.backward(mb, grads, need_input_grads=chunk.stage > 0)
            if not self.asynchronous:
                chunk.model.accumulate(mb)
            return out
        self._backward_done(mb, c, self._compute(f"B{mb}", run), finished=True)

    def backward_input(self, mb: int, c: int = 0) -> None:
        """Zero bubble's I: the input gradient, sent on at once; the weight gradient waits for W."""
        chunk = self.chunks[c]
        grads = None if chunk.stage == self.n_stages - 1 else self._received.pop(("B", mb, c))
        grad_inputs = self._compute(f"I{mb}", lambda: chunk.model.backward_input(
            mb, grads, need_input_grads=chunk.stage > 0))
        self._backward_done(mb, c, grad_inputs, finished=False)

    def backward_weight(self, mb: int, c: int = 0) -> None:
        chunk = self.chunks[c]

        def run():
            chunk.model.backward_weight(mb)
            chunk.model.accumulate(mb)       # zero-bubble schedules are flush schedules
        self._compute(f"W{mb}", run)
        if self.lead and chunk.stage == 0:
            self.rec.completions.append(time.perf_counter())

    def _backward_done(self, mb: int, c: int, grad_inputs, finished: bool) -> None:
        if not self.lead:
            return
        if self.chunks[c].stage > 0:
            self._outbox[("B", mb, c)] = grad_inputs
        elif finished:
            self.rec.completions.append(time.perf_counter())

    # point to point ------------------------------------------------------------------------------
    def _tag(self, kind: str, mb: int, to_stage: int, j: int) -> int:
        """One tag per message: a pair of devices may carry activations and gradients of several chunks."""
        return ((mb * 2 + (kind == "B")) * self.n_stages + to_stage) * 16 + j

    def _send(self, kind: str, mb: int, c: int) -> None:
        if not self.lead:
            return
        chunk = self.chunks[c]
        dst, to_stage = (chunk.next_rank, chunk.stage + 1) if kind == "F" else (chunk.prev_rank, chunk.stage - 1)
        group = self.p2p_groups.get((self.rank, dst))
        t0 = time.perf_counter()
        works = [dist.isend(self.placement.to_wire(tensor.contiguous()), dst, tag=self._tag(kind, mb, to_stage, j),
                            group=group) for j, tensor in enumerate(self._outbox.pop((kind, mb, c)))]
        if not self.rendezvous:
            for work in works:
                self._sends.add(work)
            return
        self.rec.waiting_on = [dst]
        for work in works:
            work.wait()
        self.placement.synchronize()
        self.rec.span(f"send {kind}{mb}", "wait", t0, time.perf_counter())

    def _post_recvs(self) -> None:
        """Keep the next RECV_LOOKAHEAD receives posted, so a message travels as soon as it is sent
        (gloo and NCCL move a point-to-point message only once its receive is posted; PipeDream's
        runtime posts them ahead the same way), as the simulator's transfers do."""
        while len(self._posted) < (1 if self.rendezvous else RECV_LOOKAHEAD) and self._pending_recvs:
            action, mb, c = self._pending_recvs.popleft()
            kind, (src, shapes) = action[-1], _RECV_FROM[action](self.chunks[c])
            tensors = tuple(self.placement.empty(shape) for shape in shapes)
            group = self.p2p_groups.get((src, self.rank))
            works = [dist.irecv(t, src, tag=self._tag(kind, mb, self.chunks[c].stage, j), group=group)
                     for j, t in enumerate(tensors)]
            self._posted[(kind, mb, c)] = (src, tensors, works)

    def _recv(self, kind: str, mb: int, c: int) -> None:
        if not self.lead:
            self._recv_from_lead(kind, mb, c)
            return
        t0 = time.perf_counter()
        if self.rendezvous:
            self._post_recvs()               # this receive, posted only now
        src, tensors, works = self._posted.pop((kind, mb, c))
        if not self.rendezvous:
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
        self._received[(kind, mb, c)] = tuple(self.placement.from_wire(t) for t in tensors)
        self.placement.synchronize()         # so the message's arrival is waiting, not the next compute
        self.rec.span(f"wait {kind}{mb}", "wait", t0, time.perf_counter())

    def _recv_from_lead(self, kind: str, mb: int, c: int) -> None:
        """A tensor-parallel member: what the lead received, by a broadcast in the group."""
        t0 = time.perf_counter()
        _, shapes = _RECV_FROM[f"RECV_{kind}"](self.chunks[c])
        tensors = tuple(self.placement.empty(shape) for shape in shapes)
        self.rec.waiting_on = self.tp_ranks[:1]
        for t in tensors:
            dist.broadcast(t, src=self.tp_ranks[0], group=self.tp.group)
        self._received[(kind, mb, c)] = tuple(self.placement.from_wire(t) for t in tensors)
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

    def step(self, wave: int, c: int = 0) -> None:
        self._changed(wave, f"STEP{wave}", self.chunks[c].model.step)
        self.applied = (wave + 1) * self.nm
        if self.checkpoint is not None:
            self.checkpoint(wave)

    def push(self, wave: int) -> None:
        t0 = time.perf_counter()
        version = self._pulled.pop(wave, 0)            # wave 0 runs on the initial weights, clock 0
        self.rec.staleness_global.append((self.vw, self.stage, wave, version, wave - version))
        self.wsp.push(wave)
        self.rec.span(f"push {wave}", "sync", t0, time.perf_counter())

    def pull(self, wave: int) -> None:
        t0 = time.perf_counter()
        self.rec.waiting_on = list(self.wsp.ps_ranks)
        weights, clock, held = self.wsp.pull(wave, self.model.flat, self.model.numel)
        self.model.set_flat(weights)
        self._pulled[wave] = clock
        t1 = time.perf_counter()
        self.rec.gates.append((self.vw, self.stage, wave, held, clock))
        self.rec.span(f"pull {wave}", "sync", t0, t1)

    def allreduce(self, wave: int, c: int = 0) -> None:
        """BSP: average the wave's gradients with the same stage of every VW (ring all-reduce in gloo)."""
        t0 = time.perf_counter()
        chunk = self.chunks[c]
        self.rec.waiting_on = chunk.group_ranks
        flat = chunk.model.wave_flat()
        wire = self.placement.to_wire(flat)
        dist.all_reduce(wire, group=chunk.group)
        if wire is not flat:
            flat.copy_(wire)
        self.placement.synchronize()         # NCCL: the host goes on at once; the wait belongs here
        chunk.model.scale_wave(1.0 / self.n_vw)
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
_RECV_FROM = {"RECV_F": lambda c: (c.prev_rank, c.in_shapes), "RECV_B": lambda c: (c.next_rank, c.out_shapes)}


def _inject(kind: str) -> None:
    """Testing: this rank dies (exits without a word) or hangs (never returns)."""
    if kind == "die":
        os._exit(1)
    while True:
        time.sleep(1.0)


def _chunk0(method):
    """Actions that only single-chunk schedules use (asynchronous updates, WSP, SDPipe)."""
    return lambda r, index, c: method(r, index)


# Each handler gets (rank, action index, action chunk).
_HANDLERS = {
    "F": StageRank.forward, "B": StageRank.backward,
    "I": StageRank.backward_input, "W": StageRank.backward_weight,
    "SEND_F": lambda r, mb, c: r._send("F", mb, c),
    "SEND_B": lambda r, mb, c: r._send("B", mb, c),
    "RECV_F": lambda r, mb, c: r._recv("F", mb, c),
    "RECV_B": lambda r, mb, c: r._recv("B", mb, c),
    "STEP": StageRank.step, "ALLREDUCE": StageRank.allreduce,
    "UPDATE": _chunk0(StageRank.update), "PUSH": _chunk0(StageRank.push), "PULL": _chunk0(StageRank.pull),
    "GROUP_SYNC": _chunk0(StageRank.group_sync),
}
