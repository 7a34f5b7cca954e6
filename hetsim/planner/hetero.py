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
from hetsim.memory import GIB, MemorySettings, stage_memory
from hetsim.plan import ASYNC_SCHEDULES
from hetsim.profile import ModelProfile
from hetsim.schedule.registry import schedule_kind
from hetsim.topology import Topology

__all__ = ["VwPartition", "held", "partition_ordered", "partition_vw", "partition_aligned", "gpu_orders"]


@dataclass(frozen=True, kw_only=True)
class VwPartition:
    """One virtual worker's stages: GPU s runs layers [boundaries[s], boundaries[s + 1])."""

    gpus: tuple[str, ...]
    boundaries: tuple[int, ...]
    compute_s: tuple[float, ...]         # forward + backward per minibatch, per stage
    transfer_s: tuple[float, ...]        # activations across each boundary between stages
    transfer_bytes: tuple[int, ...]      # bytes of those activations at the precision's element size
                                         # (gradients: the same again)
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


def held(schedule: str, n_stages: int, stage: int, nm: int) -> tuple[int, int]:
    """(minibatches a stage may hold at once, of them between a split backward's I and W): upper
    bounds of what the schedule IR reaches, the schedule's in-flight and deferred rules in
    hetsim.schedule.registry (one model chunk per stage)."""
    kind = schedule_kind(schedule)
    return kind.in_flight(n_stages, stage, nm, 1), kind.deferred(n_stages, stage, nm, 1)


def partition_ordered(profile: ModelProfile, gpus: list[GpuSlot], topology: Topology, *, nm: int,
                      schedule: str = "hetpipe", memory: MemorySettings | None = None,
                      cache: dict | None = None, tp: int = 1) -> VwPartition:
    """The best contiguous split of every layer over `gpus` in this order (one stage per GPU, or per
    tensor-parallel group of `tp` GPUs led by it: see `_compute`). `memory` (default: FP32 with one
    optimizer copy) sets what a stage keeps, as `hetsim.memory.stage_memory` counts it, and the bytes
    an activation takes on a link (16-bit precisions move half the profile's FP32 bytes).

    `cache` (any dict) keeps per-GPU-type tables between calls on the same profile.
    """
    cache, memory = {} if cache is None else cache, memory or MemorySettings()
    _, bounds = _best_split(profile, gpus, topology, nm, schedule, memory, cache, tp=tp)
    return _describe(profile, gpus, bounds, topology, nm, schedule, memory, cache, tp)


def _best_split(profile, gpus, topology, nm, schedule, memory: MemorySettings, cache,
                lanes: list[list[GpuSlot]] | None = None, tp: int = 1) -> tuple[float, tuple]:
    """(slowest stage seconds, stage boundaries) of the DP; describing the split is left to the caller,
    which needs it for the best order only. With `lanes` (GPU lists of equal length, `gpus` among
    them), one split for all of them: stage s costs its slowest lane's time and must fit every
    lane's GPU s."""
    lanes = lanes or [gpus]
    n, k = profile.n_layers, len(gpus)
    if k > n:
        raise PlanError(f"{profile.model}: {k} GPUs in one virtual worker but only {n} layers")
    if "cuts" not in cache:
        cache["cuts"] = np.array([profile.cut_bytes(c) for c in range(n + 1)], dtype=float)
    value = np.full(n + 1, np.inf)
    value[0] = 0.0
    choice = np.zeros((k, n + 1), dtype=np.int64)
    for s in range(k):
        rows = np.flatnonzero(np.isfinite(value))          # where stage s can start
        if not len(rows):
            break
        if rows[-1] - rows[0] + 1 == len(rows):            # a range: index by slice, without a copy
            rows = slice(int(rows[0]), int(rows[-1]) + 1)
        starts = np.arange(n + 1)[rows]
        ends = np.arange(n - (k - 1 - s) + 1)              # leave a layer for every later GPU
        flight = held(schedule, k, s, nm)
        limit = _limit(profile, lanes[0][s], flight, schedule, memory, cache, tp)
        cand = _stage_matrix(profile, lanes[0], s, topology, cache, rows, len(ends), tp, memory)
        for lane in lanes[1:]:
            limit = np.minimum(limit, _limit(profile, lane[s], flight, schedule, memory, cache, tp))
            np.maximum(cand, _stage_matrix(profile, lane, s, topology, cache, rows, len(ends), tp, memory),
                       out=cand)
        np.maximum(cand, value[rows][:, None], out=cand)
        cand[(ends[None, :] <= starts[:, None]) | (ends[None, :] > limit[rows][:, None])] = np.inf
        pick = np.argmin(cand, axis=0)
        value = np.full(n + 1, np.inf)
        value[ends] = cand[pick, ends]
        choice[s, ends] = starts[pick]
    if not np.isfinite(value[n]):
        raise PlanError(_no_fit(profile, gpus, nm, schedule, memory, tp))
    bounds = [n]
    for s in reversed(range(k)):
        bounds.append(int(choice[s, bounds[-1]]))
    return float(value[n]), tuple(reversed(bounds))


def partition_aligned(profile: ModelProfile, lanes: list[list[GpuSlot]], topology: Topology, *, nm: int,
                      schedule: str = "hetpipe", memory: MemorySettings | None = None,
                      cache: dict | None = None, tp: int = 1) -> list[VwPartition]:
    """One set of layer ranges for several virtual workers, each on its GPUs in the order given (BSP
    and SDPipe average stage by stage, so every VW needs the same ranges): the split whose slowest
    stage over all VWs is fastest, every stage fitting each VW's GPU at its position."""
    if len({len(lane) for lane in lanes}) > 1:
        raise PlanError(f"{profile.model}: virtual workers of {sorted({len(l) for l in lanes})} GPUs cannot "
                        "share layer ranges; sync bsp and sdpipe need VWs of as many stages")
    cache, memory = {} if cache is None else cache, memory or MemorySettings()
    _, bounds = _best_split(profile, lanes[0], topology, nm, schedule, memory, cache, lanes, tp)
    return [_describe(profile, lane, bounds, topology, nm, schedule, memory, cache, tp)
            for lane in lanes]


def _link_s(topology: Topology, src: GpuSlot, dst: GpuSlot, nbytes):
    route = topology.route(src.id, dst.id)
    return route.latency_s + nbytes / topology.bottleneck_Bps(src.id, dst.id)


def _compute(profile, gpu: GpuSlot, cache, topology: Topology, tp: int = 1,
             memory: MemorySettings = MemorySettings()) -> np.ndarray:
    """c[i, j]: forward + backward seconds of layers [i, j) on one GPU, or on a tensor-parallel group
    of `tp` GPUs of its node led by it: the profile's TP times (`stage_times_tp`), plus, when they
    leave them out, the activation all-reduces forward and backward on the lead's node link at the
    precision's bytes (Topology.tp_passes_s, as `hetsim.planner.estimate.plan_partitions` counts);
    with recomputation the backward runs the forward again (and its all-reduces)."""
    gpu_type, scale, redo = gpu.type.name, memory.activation_scale, memory.recompute
    if tp == 1:
        key = ("compute", gpu_type, redo)
        if key not in cache:
            profile.require_gpu_type(gpu_type)
            passes = 2 if redo else 1
            total = np.cumsum([0.0] + [passes * l.fwd_s[gpu_type] + l.bwd_s[gpu_type] for l in profile.layers])
            cache[key] = total[None, :] - total[:, None]
        return cache[key]
    key = ("compute", gpu_type, tp, topology.cluster.node(gpu.node).intra_link, scale, redo)   # like nodes share it
    if key not in cache:
        total = np.zeros(profile.n_layers + 1)
        for hi in range(1, profile.n_layers + 1):
            times = profile.stage_times_tp(gpu_type, 0, hi, tp, redo)
            ring = 0.0 if times.measured_tp else topology.tp_passes_s(gpu.node, tp, profile, 0, hi, scale, redo)
            total[hi] = times.fwd_s + times.bwd_s + ring
        cache[key] = total[None, :] - total[:, None]
    return cache[key]


def _stage_matrix(profile, gpus, s, topology, cache, rows, n_ends, tp: int,
                  memory: MemorySettings) -> np.ndarray:
    """t[i, j] for start i in `rows` and end j < n_ends: compute of layers [i, j) on GPU s plus
    receiving cut i and sending cut j, at the precision's bytes."""
    t = np.array(_compute(profile, gpus[s], cache, topology, tp, memory)[rows, :n_ends])    # a copy to work in
    cuts = cache["cuts"] * memory.activation_scale
    if s > 0:
        t += _link_s(topology, gpus[s - 1], gpus[s], cuts[rows])[:, None]
    if s + 1 < len(gpus):
        t += _link_s(topology, gpus[s], gpus[s + 1], cuts[:n_ends])[None, :]
    return t


def _limit(profile, gpu: GpuSlot, flight: tuple[int, int], schedule: str, memory: MemorySettings, cache,
           tp: int = 1) -> np.ndarray:
    key = ("limit", gpu.type.memory_bytes, gpu.type.framework_reserve_bytes, flight,
           schedule in ASYNC_SCHEDULES, memory, tp)
    if key not in cache:
        cache[key] = _max_end(profile, gpu, flight, schedule, memory, tp)
    return cache[key]


def _max_end(profile, gpu: GpuSlot, flight: tuple[int, int], schedule: str, memory: MemorySettings,
             tp: int = 1) -> np.ndarray:
    """For each start layer, the last end layer whose stage still fits the GPU (start if none), holding
    `flight` (in flight, deferred) minibatches."""
    n = profile.n_layers
    fits = lambda lo, hi: stage_memory(profile, lo, hi, in_flight=flight[0], deferred=flight[1],
                                       asynchronous=schedule in ASYNC_SCHEDULES, settings=memory,
                                       reserve_bytes=gpu.type.framework_reserve_bytes,
                                       tp=tp).total_bytes <= gpu.type.memory_bytes
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


def _describe(profile, gpus, bounds, topology, nm, schedule, memory: MemorySettings, cache,
              tp: int = 1) -> VwPartition:
    k = len(gpus)
    compute = tuple(float(_compute(profile, g, cache, topology, tp, memory)[bounds[s], bounds[s + 1]])
                    for s, g in enumerate(gpus))
    wire = [profile.cut_bytes(bounds[s + 1]) * memory.activation_scale for s in range(k - 1)]
    transfer = tuple(float(_link_s(topology, gpus[s], gpus[s + 1], wire[s])) for s in range(k - 1))
    stage = stage_seconds(compute, transfer, schedule)
    bound = [held(schedule, k, s, nm) for s in range(k)]
    footprint = tuple(stage_memory(profile, bounds[s], bounds[s + 1], in_flight=bound[s][0], deferred=bound[s][1],
                                   asynchronous=schedule in ASYNC_SCHEDULES, settings=memory,
                                   reserve_bytes=gpus[s].type.framework_reserve_bytes, tp=tp).total_bytes
                      for s in range(k))
    return VwPartition(gpus=tuple(g.id for g in gpus), boundaries=bounds, compute_s=compute,
                       transfer_s=transfer, transfer_bytes=tuple(int(b) for b in wire), stage_s=stage,
                       memory_bytes=footprint,
                       param_bytes=tuple(profile.stage_param_bytes(bounds[s], bounds[s + 1])
                                         for s in range(k)))


def stage_seconds(compute: tuple[float, ...] | list[float], transfer: tuple[float, ...] | list[float],
                  schedule: str, blocking_p2p: bool = False) -> tuple[float, ...]:
    """Each stage's seconds a minibatch: its compute and the transfers across its boundaries, counted
    once (a transfer holds its sender at most), or both ways under a schedule of rendezvous transfers
    (DeepSpeed's: each holds sender and receiver until delivered, an activation and a gradient). With
    the plan's `blocking_p2p` DeepSpeed's sends hold their sender alone, but a forward step's activation
    leaves the stage before only once that stage has taken the gradient sent back: the boundary in
    counts twice, the boundary out once (tests/sim/test_pipeline.py derives it)."""
    k = len(compute)
    before = lambda s: transfer[s - 1] if s else 0.0
    after = lambda s: transfer[s] if s + 1 < k else 0.0
    if not schedule_kind(schedule).explicit_p2p:
        return tuple(compute[s] + before(s) + after(s) for s in range(k))
    if blocking_p2p:
        return tuple(compute[s] + 2 * before(s) + after(s) for s in range(k))
    return tuple(compute[s] + 2 * (before(s) + after(s)) for s in range(k))


def _no_fit(profile, gpus, nm, schedule, memory: MemorySettings, tp: int = 1) -> str:
    # The whole model as one stage of this schedule holds what such a stage would (1F1B: one minibatch).
    flight, deferred = held(schedule, 1, 0, nm)
    whole = stage_memory(profile, 0, profile.n_layers, in_flight=flight, deferred=deferred,
                         asynchronous=schedule in ASYNC_SCHEDULES, settings=memory)
    have = tp * sum(g.type.memory_bytes for g in gpus)
    group = f" x TP {tp}" if tp > 1 else ""
    names = ", ".join(f"{g.id}{group} ({g.type.memory_gib:.1f} GiB)" for g in gpus)
    hints = (["lower Nm"] if nm > 1 else []) + ["add GPUs", "raise tensor parallelism (--tp)"] + (
        [] if memory.recompute else ["recompute activations (--recompute)"])
    return (f"{profile.model} (minibatch {profile.batch_size}, Nm={nm}) does not fit {names}: every split "
            f"leaves a stage over its GPU's memory (on one GPU, holding {flight} minibatch(es), it would need "
            f"{whole.total_bytes / GIB:.2f} GiB; these GPUs have {have / GIB:.1f} GiB together); "
            f"{', '.join(hints[:-1])} or {hints[-1]}")


def gpu_orders(gpus: list[GpuSlot], max_orders: int = 720) -> list[list[GpuSlot]] | None:
    """Distinct orders of the GPUs, GPUs with the same type and node being interchangeable.

    With more than `max_orders` of them, only orders that keep each node's GPUs together (activations
    then cross the network once per node boundary); None if even those are too many.
    """
    signature = lambda g: (g.type.name, g.node)
    pools: dict[tuple, list[GpuSlot]] = {}
    for g in sorted(gpus, key=lambda g: g.id):
        pools.setdefault(signature(g), []).append(g)
    counts = [len(pools[key]) for key in sorted(pools)]     # in the order _multiset_orders walks the keys
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
                 schedule: str = "hetpipe", memory: MemorySettings | None = None,
                 max_orders: int = 720, cache: dict | None = None, tp: int = 1) -> VwPartition:
    """The best GPU order and split for one virtual worker; ties keep the first order tried.

    Orders are enumerated (`gpu_orders`) while there are at most `max_orders`; beyond that, node
    blocks are reordered by swapping pairs while the slowest stage improves, from the fastest-first
    and the slowest-first order (a local search, not a guaranteed optimum). Orders that differ only
    by renaming alike nodes (`_node_kinds`) have the same stage times and are solved once; only the
    best order's split is described.
    """
    tried: dict[tuple, _Split | PlanError] = {}
    cache = {} if cache is None else cache              # tables of this profile, see partition_ordered
    memory = memory or MemorySettings()
    kind = _node_kinds(gpus, topology)

    def evaluate(order: list[GpuSlot]):
        key = _order_key(order, kind)
        if key not in tried:
            try:
                tried[key] = _Split(order, *_best_split(profile, order, topology, nm, schedule,
                                                        memory, cache, tp=tp))
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
    found = [p for p in tried.values() if isinstance(p, _Split)]
    if not found:
        raise next(iter(tried.values()))
    best = min(found, key=lambda p: p.bottleneck_s)
    return _describe(profile, best.order, best.bounds, topology, nm, schedule, memory, cache, tp)


@dataclass(frozen=True)
class _Split:
    order: list[GpuSlot]
    bottleneck_s: float
    bounds: tuple[int, ...]


def _node_kinds(gpus: list[GpuSlot], topology: Topology) -> dict[str, object]:
    """Nodes that play the same part in any order: same links and the same GPU types of this VW.
    Slower node-to-node paths make every node distinct."""
    cluster = topology.cluster
    types: dict[str, list[str]] = {}
    for g in gpus:
        types.setdefault(g.node, []).append(g.type.name)
    if cluster.paths:
        return {name: name for name in types}
    return {name: (repr(cluster.node(name).intra_link), repr(cluster.nic(name)), cluster.node(name).nic_per_gpu,
                   tuple(sorted(t))) for name, t in types.items()}


def _order_key(order: list[GpuSlot], kind: dict[str, object]) -> tuple:
    """Orders equal up to renaming nodes of one kind have the same stage times: one key for them
    (nodes numbered by first appearance)."""
    rank: dict[str, int] = {}
    return tuple((g.type.name, kind[g.node], rank.setdefault(g.node, len(rank))) for g in order)


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
