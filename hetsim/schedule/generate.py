"""Schedule generators: GPipe, PipeDream 1F1B (asynchronous and flush) and HetPipe's Nm-in-flight pipeline.

Each generator decides only the order of forwards and backwards on a stage; `build_schedule` adds the
point-to-point sends/receives, the optimiser actions and the sync actions around them.
"""

from __future__ import annotations

import heapq
from functools import lru_cache

from hetsim.schedule.ir import Action, Schedule

__all__ = ["build_schedule", "warmup_forwards", "compute_order", "greedy_orders"]


def warmup_forwards(name: str, n_stages: int, nm: int, stage: int) -> int:
    """Forwards a stage runs before its first backward in the fixed-order schedules.

    1f1b / 1f1b-flush (PipeDream): min(Nm, k - s), so with Nm = k stage s holds k - s minibatches.
    gpipe: all Nm forwards of the wave.
    """
    if name == "gpipe":
        return nm
    return min(nm, n_stages - stage)


def _one_f_one_b(first: int, count: int, warmup: int) -> list[tuple[str, int]]:
    """Warm-up forwards, then alternate one forward and one backward, then drain the backwards."""
    order: list[tuple[str, int]] = [("F", first + i) for i in range(min(warmup, count))]
    next_f, next_b = first + len(order), first
    while next_b < first + count:
        order.append(("B", next_b))
        next_b += 1
        if next_f < first + count:
            order.append(("F", next_f))
            next_f += 1
    return order


def greedy_orders(nm: int, n_minibatches: int, costs: tuple[tuple[float, float, float], ...]
                  ) -> list[list[tuple[str, int]]]:
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
    orders: list[list[tuple[str, int]]] = [[] for _ in range(k)]
    while any(ready):
        start, s, task = _next_start(ready, free)
        kind, mb = ("B" if task[1] == 0 else "F"), task[2]
        ready[s].remove(task)
        heapq.heapify(ready[s])
        fwd, bwd, comm = costs[s]
        end = free[s] = start + (fwd if kind == "F" else bwd)
        orders[s].append((kind, mb))
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


def compute_order(name: str, n_stages: int, nm: int, stage: int, n_minibatches: int) -> list[tuple[str, int]]:
    """The stage's forwards and backwards in order, with "wave" markers (kind "W", wave) after each flush."""
    warmup = warmup_forwards(name, n_stages, nm, stage)
    if name == "1f1b":
        return _one_f_one_b(0, n_minibatches, warmup)
    order: list[tuple[str, int]] = []
    for first in range(0, n_minibatches, nm):
        count = min(nm, n_minibatches - first)
        if name == "gpipe":
            order += [("F", first + i) for i in range(count)] + [("B", first + i) for i in range(count)]
        else:
            order += _one_f_one_b(first, count, warmup)
        order.append(("W", first // nm))
    return order


@lru_cache(maxsize=64)
def build_schedule(name: str, n_stages: int, nm: int, waves: int, sync: str = "none",
                   costs: tuple[tuple[float, float, float], ...] | None = None) -> Schedule:
    """The full IR for one virtual worker: `waves` waves of `nm` minibatches.

    `costs` (per stage: forward, backward, transfer to the next stage, in seconds) shape the hetpipe
    order; without them every stage is taken as forward 1, backward 2, transfer 0.
    Sync actions by mode: wsp -> PULL before each wave w >= 1 and PUSH after it; bsp -> ALLREDUCE
    before each flush's STEP; sdpipe -> GROUP_SYNC after each wave; none -> nothing.
    """
    n_mb = nm * waves
    asynchronous = name in ("1f1b", "hetpipe")
    if name == "hetpipe":
        orders = greedy_orders(nm, n_mb, costs or ((1.0, 2.0, 0.0),) * n_stages)
    else:
        orders = [compute_order(name, n_stages, nm, s, n_mb) for s in range(n_stages)]
    stages = []
    for s in range(n_stages):
        actions: list[Action] = []
        for kind, i in orders[s]:
            if kind == "W":
                actions += _flush_actions(i, sync)
            elif kind == "F":
                if sync == "wsp" and i % nm == 0 and i > 0:
                    actions.append(Action("PULL", i // nm))
                actions += _forward(s, n_stages, i)
            else:
                actions += _backward(s, n_stages, i)
                if asynchronous:
                    actions.append(Action("UPDATE", i))
                    if (i + 1) % nm == 0:
                        actions += _wave_end_async(i // nm, sync)
        stages.append(tuple(actions))
    return Schedule(name=name, nm=nm, n_minibatches=n_mb, stages=tuple(stages))


def _forward(s: int, k: int, mb: int) -> list[Action]:
    return ([Action("RECV_F", mb)] if s > 0 else []) + [Action("F", mb)] + \
        ([Action("SEND_F", mb)] if s < k - 1 else [])


def _backward(s: int, k: int, mb: int) -> list[Action]:
    return ([Action("RECV_B", mb)] if s < k - 1 else []) + [Action("B", mb)] + \
        ([Action("SEND_B", mb)] if s > 0 else [])


def _flush_actions(wave: int, sync: str) -> list[Action]:
    if sync == "bsp":
        return [Action("ALLREDUCE", wave), Action("STEP", wave)]
    tail = {"wsp": [Action("PUSH", wave)], "sdpipe": [Action("GROUP_SYNC", wave)]}.get(sync, [])
    return [Action("STEP", wave)] + tail


def _wave_end_async(wave: int, sync: str) -> list[Action]:
    return {"wsp": [Action("PUSH", wave)], "sdpipe": [Action("GROUP_SYNC", wave)]}.get(sync, [])
