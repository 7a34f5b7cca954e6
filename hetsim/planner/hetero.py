"""Contiguous stages over an ordered list of unequal GPUs: HetPipe's partitioning inside a virtual worker.

HetPipe (ATC'20, section 4) splits the model into k contiguous partitions, one per GPU of the
virtual worker, so that the slowest stage is as fast as possible while every partition fits its GPU
with Nm minibatches in flight and their stashed weights. A stage's time here is its compute on that
GPU (forward + backward) plus its transfers: the activations it receives and the ones it sends, each
at the slowest link of its route (gradients flow back over the same full-duplex links at the same
time). Memory comes from `hetsim.memory.stage_memory`, the rule the simulator's check applies.

Because a stage's memory only grows as it takes more layers, the feasible stages starting at layer i
are exactly those ending at or before some layer, found by bisection; the dynamic program over
(stage, end layer) is then O(k n^2), vectorised over the start layer. The GPU order is chosen by
trying every distinct order of (GPU type, node) signatures, or of whole nodes when there are too many.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from hetsim.cluster import GpuSlot
from hetsim.errors import PlanError
from hetsim.memory import GIB, stage_memory
from hetsim.plan import ASYNC_SCHEDULES
from hetsim.profile import ModelProfile
from hetsim.topology import Topology

__all__ = ["VwPartition", "in_flight", "partition_ordered", "partition_vw", "gpu_orders"]


@dataclass(frozen=True, kw_only=True)
class VwPartition:
    """One virtual worker's stages: GPU s runs layers [boundaries[s], boundaries[s + 1])."""

    gpus: tuple[str, ...]
    boundaries: tuple[int, ...]
    compute_s: tuple[float, ...]         # forward + backward per minibatch, per stage
    transfer_s: tuple[float, ...]        # activations across each boundary between stages
    transfer_bytes: tuple[int, ...]      # bytes of those activations (gradients: the same again)
    param_bytes: tuple[int, ...]         # weights of each stage
    stage_s: tuple[float, ...]           # compute + transfers in and out
    memory_bytes: tuple[int, ...]

    @property
    def bottleneck_s(self) -> float:
        return max(self.stage_s)

    @property
    def bottleneck_gpu(self) -> str:
        return self.gpus[int(np.argmax(self.stage_s))]

    @property
    def roundtrip_s(self) -> float:
        """One minibatch forward and backward through every stage, transfers both ways."""
        return sum(self.compute_s) + 2 * sum(self.transfer_s)

    @property
    def layers(self) -> tuple[tuple[int, int], ...]:
        return tuple(zip(self.boundaries[:-1], self.boundaries[1:]))


def in_flight(schedule: str, n_stages: int, stage: int, nm: int) -> int:
    """Minibatches a stage may hold at once, an upper bound of what the schedule IR reaches.

    1f1b / 1f1b-flush: min(Nm, k - s) (PipeDream's warm-up). hetpipe: Nm, except on the last stage,
    whose backward is ready the instant its forward ends and runs first (backward wins ties), so it
    holds one. gpipe: Nm.
    """
    if schedule in ("1f1b", "1f1b-flush"):
        return min(nm, n_stages - stage)
    if schedule == "hetpipe" and stage == n_stages - 1:
        return 1
    return nm


def partition_ordered(profile: ModelProfile, gpus: list[GpuSlot], topology: Topology, *, nm: int,
                      schedule: str = "hetpipe", optimizer_state_copies: int = 1,
                      cache: dict | None = None) -> VwPartition:
    """The best contiguous split of every layer over `gpus` in this order (one stage per GPU).

    `cache` (any dict) keeps per-GPU-type tables between calls on the same profile.
    """
    cache = {} if cache is None else cache
    n, k = profile.n_layers, len(gpus)
    if k > n:
        raise PlanError(f"{profile.model}: {k} GPUs in one virtual worker but only {n} layers")
    if "cuts" not in cache:
        cache["cuts"] = np.array([profile.cut_bytes(c) for c in range(n + 1)], dtype=float)
    value = np.full(n + 1, np.inf)
    value[0] = 0.0
    choice = np.zeros((k, n + 1), dtype=np.int64)
    for s, gpu in enumerate(gpus):
        rows = np.flatnonzero(np.isfinite(value))          # where stage s can start
        if not len(rows):
            break
        if rows[-1] - rows[0] + 1 == len(rows):            # a range: index by slice, without a copy
            rows = slice(int(rows[0]), int(rows[-1]) + 1)
        starts = np.arange(n + 1)[rows]
        ends = np.arange(n - (k - 1 - s) + 1)              # leave a layer for every later GPU
        limit = _limit(profile, gpu, in_flight(schedule, k, s, nm), schedule, optimizer_state_copies, cache)
        cand = _stage_matrix(profile, gpus, s, topology, cache, rows, len(ends))
        np.maximum(cand, value[rows][:, None], out=cand)
        cand[(ends[None, :] <= starts[:, None]) | (ends[None, :] > limit[rows][:, None])] = np.inf
        pick = np.argmin(cand, axis=0)
        value = np.full(n + 1, np.inf)
        value[ends] = cand[pick, ends]
        choice[s, ends] = starts[pick]
    if not np.isfinite(value[n]):
        raise PlanError(_no_fit(profile, gpus, nm, schedule, optimizer_state_copies))
    bounds = [n]
    for s in reversed(range(k)):
        bounds.append(int(choice[s, bounds[-1]]))
    return _describe(profile, gpus, tuple(reversed(bounds)), topology, nm, schedule,
                     optimizer_state_copies, cache)


def _link_s(topology: Topology, src: GpuSlot, dst: GpuSlot, nbytes):
    route = topology.route(src.id, dst.id)
    return route.latency_s + nbytes / topology.bottleneck_Bps(src.id, dst.id)


def _compute(profile, gpu_type: str, cache) -> np.ndarray:
    """c[i, j]: forward + backward seconds of layers [i, j) on one GPU type."""
    key = ("compute", gpu_type)
    if key not in cache:
        profile.require_gpu_type(gpu_type)
        total = np.cumsum([0.0] + [l.fwd_s[gpu_type] + l.bwd_s[gpu_type] for l in profile.layers])
        cache[key] = total[None, :] - total[:, None]
    return cache[key]


def _stage_matrix(profile, gpus, s, topology, cache, rows, n_ends) -> np.ndarray:
    """t[i, j] for start i in `rows` and end j < n_ends: compute of layers [i, j) on GPU s plus
    receiving cut i and sending cut j."""
    t = np.array(_compute(profile, gpus[s].type.name, cache)[rows, :n_ends])    # a copy to work in
    cuts = cache["cuts"]
    if s > 0:
        t += _link_s(topology, gpus[s - 1], gpus[s], cuts[rows])[:, None]
    if s + 1 < len(gpus):
        t += _link_s(topology, gpus[s], gpus[s + 1], cuts[:n_ends])[None, :]
    return t


def _limit(profile, gpu: GpuSlot, flight: int, schedule: str, copies: int, cache) -> np.ndarray:
    key = ("limit", gpu.type.memory_bytes, gpu.type.framework_reserve_bytes, flight,
           schedule in ASYNC_SCHEDULES, copies)
    if key not in cache:
        cache[key] = _max_end(profile, gpu, flight, schedule, copies)
    return cache[key]


def _max_end(profile, gpu: GpuSlot, flight: int, schedule: str, copies: int) -> np.ndarray:
    """For each start layer, the last end layer whose stage still fits the GPU (start if none)."""
    n = profile.n_layers
    fits = lambda lo, hi: stage_memory(profile, lo, hi, in_flight=flight,
                                       asynchronous=schedule in ASYNC_SCHEDULES, optimizer_state_copies=copies,
                                       reserve_bytes=gpu.type.framework_reserve_bytes).total_bytes <= gpu.type.memory_bytes
    out = np.zeros(n + 1, dtype=np.int64)
    for lo in range(n + 1):
        a, b = lo, n                     # fits(lo, a) holds (an empty stage), find the last hi
        while a < b:
            mid = (a + b + 1) // 2
            if fits(lo, mid):
                a = mid
            else:
                b = mid - 1
        out[lo] = a
    return out


def _describe(profile, gpus, bounds, topology, nm, schedule, copies, cache) -> VwPartition:
    k = len(gpus)
    compute = tuple(float(_compute(profile, g.type.name, cache)[bounds[s], bounds[s + 1]])
                    for s, g in enumerate(gpus))
    nbytes = tuple(profile.cut_bytes(bounds[s + 1]) for s in range(k - 1))
    transfer = tuple(float(_link_s(topology, gpus[s], gpus[s + 1], nbytes[s])) for s in range(k - 1))
    stage = tuple(compute[s] + (transfer[s - 1] if s else 0.0) + (transfer[s] if s + 1 < k else 0.0)
                  for s in range(k))
    memory = tuple(stage_memory(profile, bounds[s], bounds[s + 1], in_flight=in_flight(schedule, k, s, nm),
                                asynchronous=schedule in ASYNC_SCHEDULES, optimizer_state_copies=copies,
                                reserve_bytes=gpus[s].type.framework_reserve_bytes).total_bytes for s in range(k))
    return VwPartition(gpus=tuple(g.id for g in gpus), boundaries=bounds, compute_s=compute,
                       transfer_s=transfer, transfer_bytes=nbytes, stage_s=stage, memory_bytes=memory,
                       param_bytes=tuple(profile.stage_param_bytes(bounds[s], bounds[s + 1])
                                         for s in range(k)))


def _no_fit(profile, gpus, nm, schedule, copies) -> str:
    whole = stage_memory(profile, 0, profile.n_layers, in_flight=nm,
                         asynchronous=schedule in ASYNC_SCHEDULES, optimizer_state_copies=copies)
    have = sum(g.type.memory_bytes for g in gpus)
    names = ", ".join(f"{g.id} ({g.type.memory_gib:.1f} GiB)" for g in gpus)
    return (f"{profile.model} (minibatch {profile.batch_size}, Nm={nm}) does not fit {names}: every split "
            f"leaves a stage over its GPU's memory (on one GPU it would need {whole.total_bytes / GIB:.2f} "
            f"GiB, these GPUs have {have / GIB:.1f} GiB together); lower Nm or add GPUs")


def gpu_orders(gpus: list[GpuSlot], max_orders: int = 720) -> list[list[GpuSlot]] | None:
    """Distinct orders of the GPUs, GPUs with the same type and node being interchangeable.

    With more than `max_orders` of them, only orders that keep each node's GPUs together (activations
    then cross the network once per node boundary); None if even those are too many.
    """
    signature = lambda g: (g.type.name, g.node)
    pools: dict[tuple, list[GpuSlot]] = {}
    for g in sorted(gpus, key=lambda g: g.id):
        pools.setdefault(signature(g), []).append(g)
    counts = [len(v) for v in pools.values()]
    n_orders = math.factorial(len(gpus)) // math.prod(math.factorial(c) for c in counts)
    if n_orders <= max_orders:
        return [_assign(order, pools) for order in _multiset_orders(sorted(pools), counts)]
    blocks = _node_blocks(gpus)
    if math.factorial(len(blocks)) > max_orders:
        return None
    return [[g for block in perm for g in block] for perm in itertools.permutations(blocks)]


def _node_blocks(gpus: list[GpuSlot]) -> list[list[GpuSlot]]:
    nodes: dict[str, list[GpuSlot]] = {}
    for g in sorted(gpus, key=lambda g: (g.node, g.type.name, g.index)):
        nodes.setdefault(g.node, []).append(g)
    return [nodes[name] for name in sorted(nodes)]


def _multiset_orders(keys: list, counts: list[int]):
    if not any(counts):
        yield ()
        return
    for i, key in enumerate(keys):
        if counts[i]:
            counts[i] -= 1
            for rest in _multiset_orders(keys, counts):
                yield (key,) + rest
            counts[i] += 1


def _assign(order: tuple, pools: dict) -> list[GpuSlot]:
    used = {key: 0 for key in pools}
    out = []
    for key in order:
        out.append(pools[key][used[key]])
        used[key] += 1
    return out


def partition_vw(profile: ModelProfile, gpus: list[GpuSlot], topology: Topology, *, nm: int,
                 schedule: str = "hetpipe", optimizer_state_copies: int = 1,
                 max_orders: int = 720, cache: dict | None = None) -> VwPartition:
    """The best GPU order and split for one virtual worker; ties keep the first order tried.

    Orders are enumerated (`gpu_orders`) while there are at most `max_orders`; beyond that, node
    blocks are reordered by swapping pairs while the slowest stage improves, from the fastest-first
    and the slowest-first order (a local search, not a guaranteed optimum).
    """
    tried: dict[tuple, VwPartition | PlanError] = {}
    cache = {} if cache is None else cache              # tables of this profile, see partition_ordered

    def evaluate(order: list[GpuSlot]):
        key = tuple(g.id for g in order)
        if key not in tried:
            try:
                tried[key] = partition_ordered(profile, order, topology, nm=nm, schedule=schedule,
                                               optimizer_state_copies=optimizer_state_copies, cache=cache)
            except PlanError as exc:
                tried[key] = exc
        return tried[key]

    orders = gpu_orders(gpus, max_orders)
    for order in orders if orders is not None else []:
        evaluate(order)
    if orders is None:
        blocks = _node_blocks(gpus)
        speed = lambda b: -sum(g.type.peak_fp32_flops for g in b)
        for seed in (sorted(blocks, key=speed), sorted(blocks, key=speed)[::-1]):
            _swap_search(seed, evaluate)
    found = [p for p in tried.values() if isinstance(p, VwPartition)]
    if not found:
        raise next(iter(tried.values()))
    return min(found, key=lambda p: p.bottleneck_s)


def _swap_search(blocks: list[list[GpuSlot]], evaluate) -> None:
    """Swap the pair of node blocks that most lowers the slowest stage, until no swap does."""
    score = lambda bs: getattr(evaluate([g for b in bs for g in b]), "bottleneck_s", math.inf)
    current = score(blocks)
    while True:
        moves = []
        for i, j in itertools.combinations(range(len(blocks)), 2):
            trial = list(blocks)
            trial[i], trial[j] = trial[j], trial[i]
            moves.append((score(trial), i, j, trial))
        best = min(moves, key=lambda m: m[:3], default=None)
        if best is None or best[0] >= current:
            return
        current, blocks = best[0], best[3]
