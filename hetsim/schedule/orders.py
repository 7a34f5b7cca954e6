"""Order generators: which forwards and backwards each device runs, in which order, for one schedule.

An order is a list of Actions per device using only the compute kinds (F, B, or I and W when the
backward is split) plus a FLUSH marker (index = wave) where a flush schedule steps the optimiser.
`hetsim.schedule.generate.build_schedule` wraps them in sends, receives, updates and sync actions;
a schedule whose runtime fixes where its transfers go (registry `explicit_p2p`: DeepSpeed's) lists
its sends and receives itself.
Every generator has the same signature (see `OrderRequest`), so the registry can hold them side by side.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from hetsim.schedule.ir import Action

__all__ = ["OrderRequest", "FLUSH", "warmup_forwards", "greedy_orders", "gpipe",
           "one_f_one_b", "one_f_one_b_flush", "hetpipe", "interleaved", "zero_bubble_h1", "deepspeed"]

FLUSH = "FLUSH"


@dataclass(frozen=True)
class OrderRequest:
    """What a generator may use: `n_devices` pipeline devices, each holding `chunks` model chunks
    (virtual stages), waves of `nm` minibatches, and per-stage costs (hetpipe only)."""

    n_devices: int
    nm: int
    n_minibatches: int
    chunks: int = 1
    costs: tuple[tuple[float, float, float], ...] | None = None


def warmup_forwards(name: str, n_stages: int, nm: int, stage: int) -> int:
    """Forwards a stage runs before its first backward in the fixed-order schedules.

    1f1b / 1f1b-flush / zb-h1 (PipeDream): min(Nm, k - s), so with Nm = k stage s holds k - s minibatches.
    gpipe: all Nm forwards of the wave.
    """
    if name == "gpipe":
        return nm
    return min(nm, n_stages - stage)


def _one_f_one_b(first: int, count: int, warmup: int) -> list[Action]:
    """Warm-up forwards, then alternate one backward and one forward, then drain the backwards."""
    order = [Action("F", first + i) for i in range(min(warmup, count))]
    next_f, next_b = first + len(order), first
    while next_b < first + count:
        order.append(Action("B", next_b))
        next_b += 1
        if next_f < first + count:
            order.append(Action("F", next_f))
            next_f += 1
    return order


def _waves(req: OrderRequest, wave_order) -> list[list[Action]]:
    """A flush schedule: `wave_order(device, first, count)` for every wave, each closed by FLUSH."""
    out = []
    for d in range(req.n_devices):
        order: list[Action] = []
        for first in range(0, req.n_minibatches, req.nm):
            order += wave_order(d, first, min(req.nm, req.n_minibatches - first))
            order.append(Action(FLUSH, first // req.nm))
        out.append(order)
    return out


def gpipe(req: OrderRequest) -> list[list[Action]]:
    """GPipe: every forward of the wave, then every backward."""
    return _waves(req, lambda d, first, count: [Action("F", first + i) for i in range(count)]
                  + [Action("B", first + i) for i in range(count)])


def one_f_one_b_flush(req: OrderRequest) -> list[list[Action]]:
    """PipeDream-Flush: 1F1B inside each wave, a flush between waves."""
    p, nm = req.n_devices, req.nm
    return _waves(req, lambda d, first, count: _one_f_one_b(first, count, warmup_forwards("1f1b", p, nm, d)))


def one_f_one_b(req: OrderRequest) -> list[list[Action]]:
    """PipeDream's asynchronous 1F1B: one warm-up, then 1F1B across every wave."""
    return [_one_f_one_b(0, req.n_minibatches, warmup_forwards("1f1b", req.n_devices, req.nm, d))
            for d in range(req.n_devices)]


def interleaved(req: OrderRequest) -> list[list[Action]]:
    """Megatron's interleaved 1F1B (Narayanan et al., SC'21 §2.2): device d holds chunks (virtual
    stages) d, d + p, ...; forwards go through the chunks in groups of p minibatches, chunk 0 first;
    backwards in the same groups, last chunk first. Device d warms up with 2(p - d - 1) + (v - 1)p
    forwards, then alternates one forward and one backward, then drains the backwards."""
    p, v = req.n_devices, req.chunks

    def wave(d: int, first: int, count: int) -> list[Action]:
        def step(k: int, backward: bool) -> Action:
            group, r = divmod(k, p * v)
            chunk = v - 1 - r // p if backward else r // p
            return Action("B" if backward else "F", first + group * p + r % p, chunk)
        total = count * v
        warmup = min(total, 2 * (p - d - 1) + (v - 1) * p)
        order = [step(k, False) for k in range(warmup)]
        for i in range(total - warmup):
            order += [step(warmup + i, False), step(i, True)]
        return order + [step(k, True) for k in range(total - warmup, total)]
    return _waves(req, wave)


def zero_bubble_h1(req: OrderRequest) -> list[list[Action]]:
    """ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR'24 §3.1): the backward splits into
    I (input gradient, on the critical path) and W (weight gradient, deferrable). Stage i runs 1F1B's
    warm-up, then I, F pairs, keeping up to i weight gradients deferred: they fill the bubble at the
    wave's end. Every stage holds at most p minibatches (forwarded, W not yet run), 1F1B's peak."""
    p = req.n_devices

    def wave(d: int, first: int, count: int) -> list[Action]:
        order = [Action("F", first + j) for j in range(min(count, p - d))]
        next_f, pending = first + len(order), []
        for mb in range(first, first + count):
            order.append(Action("I", mb))
            pending.append(mb)
            while len(pending) > d:
                order.append(Action("W", pending.pop(0)))
            if next_f < first + count:
                order.append(Action("F", next_f))
                next_f += 1
        return order + [Action("W", mb) for mb in pending]
    return _waves(req, wave)


def hetpipe(req: OrderRequest) -> list[list[Action]]:
    """HetPipe's Nm-in-flight pipeline ordered by the stages' nominal costs (`greedy_orders`)."""
    costs = req.costs or ((1.0, 2.0, 0.0),) * req.n_devices
    return greedy_orders(req.nm, req.n_minibatches, costs)


def greedy_orders(nm: int, n_minibatches: int, costs: tuple[tuple[float, float, float], ...]
                  ) -> list[list[Action]]:
    """HetPipe's pipeline: each stage runs whichever task is ready first (backward first on a tie)
    and the input stage admits minibatch i once minibatch i - Nm has finished there, so Nm are in
    flight. `costs[s]` = (forward s, backward s, transfer s to s+1) nominal seconds; the order this
    list scheduling produces becomes the fixed IR that simulator and executor replay.
    """
    k = len(costs)
    ready: list[list[tuple[float, int, int]]] = [[] for _ in range(k)]   # (time, 0=B/1=F, mb)
    for mb in range(min(nm, n_minibatches)):
        heapq.heappush(ready[0], (0.0, 1, mb))
    free = [0.0] * k
    orders: list[list[Action]] = [[] for _ in range(k)]
    while any(ready):
        start, s, task = _next_start(ready, free)
        kind, mb = ("B" if task[1] == 0 else "F"), task[2]
        ready[s].remove(task)
        heapq.heapify(ready[s])
        fwd, bwd, comm = costs[s]
        end = free[s] = start + (fwd if kind == "F" else bwd)
        orders[s].append(Action(kind, mb))
        for target in _successors(s, kind, mb, end, k, nm, n_minibatches, costs):
            heapq.heappush(ready[target[0]], target[1])
    return orders


def _next_start(ready, free):
    """The stage that can start a task soonest, and that task (backward first among the ready)."""
    best = None
    for s, tasks in enumerate(ready):
        if not tasks:
            continue
        start = max(free[s], tasks[0][0])
        task = min((t for t in tasks if t[0] <= start), key=lambda t: (t[1], t[2]))
        if best is None or start < best[0]:
            best = (start, s, task)
    return best


def _successors(s, kind, mb, end, k, nm, n_mb, costs):
    if kind == "F":
        return [(s, (end, 0, mb))] if s == k - 1 else [(s + 1, (end + costs[s][2], 1, mb))]
    if s > 0:
        return [(s - 1, (end + costs[s - 1][2], 0, mb))]
    return [(0, (end, 1, mb + nm))] if mb + nm < n_mb else []


def deepspeed(req: OrderRequest) -> list[list[Action]]:
    """DeepSpeed's PipelineEngine TrainSchedule (deepspeed.runtime.pipe.schedule, as Megatron-DeepSpeed
    runs pipelines): 2(Nm + p - 1) lockstep steps per wave; on even steps even stages run a forward and
    odd stages a backward, and the other way round on odd steps. A step first does its transfers, each a
    blocking call paired with the neighbour's: a forward step sends the previous step's input gradient
    back, then receives its activation; a backward step receives its output gradient, then sends the
    previous step's activation on (the order of DeepSpeed's releases since early 2023; earlier ones ran
    each pair the other way round). Transfers are therefore part of the order (explicit_p2p), and a
    stage's activation leaves only at its next step."""
    p = req.n_devices

    def wave(d: int, first: int, count: int) -> list[Action]:
        order, previous = [], None
        for step in range(2 * (count + p - 1)):
            mb, forward = _deepspeed_step(step, d, p)
            valid = 0 <= mb < count
            had = previous is not None
            if forward:
                order += [Action("SEND_B", first + previous)] if had and d > 0 else []
                order += [Action("RECV_F", first + mb)] if valid and d > 0 else []
            else:
                order += [Action("RECV_B", first + mb)] if valid and d < p - 1 else []
                order += [Action("SEND_F", first + previous)] if had and d < p - 1 else []
            order += [Action("F" if forward else "B", first + mb)] if valid else []
            previous = mb if valid else None
        return order
    return _waves(req, wave)


def _deepspeed_step(step: int, d: int, p: int) -> tuple[int, bool]:
    """(minibatch of the wave, forward?) that stage d of p works on at `step` (may be out of range)."""
    if step % 2 == d % 2:
        return step // 2 - d // 2, True
    if step % 2 == 0:
        return step // 2 - p + (d + 1) // 2, False
    return (step - 1) // 2 - p + 1 + d // 2, False
