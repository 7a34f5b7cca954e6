"""Whole-plan search: allocations x Nm x D, pruned by the closed form, ranked by the simulator.

Every candidate is partitioned (`hetsim.planner.hetero`), checked by `hetsim.feasibility.check_plan`
(the one place the memory and structure rules live) and estimated in closed form
(`hetsim.planner.estimate`). The best `top_k` estimates, and every estimate within `margin` of the best,
are then simulated in parallel on local cores; results come back in submission order, so the ranking is
deterministic. Candidates that cannot run keep the reason.
"""

from __future__ import annotations

import os
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Callable

from hetsim.cluster import Cluster, GpuSlot
from hetsim.errors import HetsimError, PlanError
from hetsim.feasibility import check_plan
from hetsim.plan import SCHEDULES, Plan, StageSpec, SyncSpec, VirtualWorker
from hetsim.planner.allocation import Allocation, allocate
from hetsim.planner.estimate import Estimate, bsp_estimate, vw_rate, wsp_estimate
from hetsim.planner.hetero import VwPartition, partition_vw
from hetsim.profile import ModelProfile
from hetsim.topology import Topology

__all__ = ["SearchSpace", "Candidate", "SearchResult", "search_plans", "POLICY_CHOICES"]

POLICY_CHOICES = ("NP", "ED", "HD", "auto", "horovod")


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    """What to try and how to rank. `horovod` in policies adds BSP data parallelism on every GPU that
    holds the model alone (one minibatch per step, ring all-reduce)."""

    policies: tuple[str, ...] = ("NP", "ED", "HD")
    nm_values: tuple[int, ...] = (1, 2, 4, 8)
    staleness_values: tuple[int, ...] = (0,)
    schedule: str = "hetpipe"
    top_k: int = 5
    margin: float = 0.1
    waves: int = 12
    warmup_waves: int = 2
    # A little compute jitter: without any, identical VWs run in perfect lockstep and all push,
    # pull and send activations at the same instants, which no real cluster does.
    jitter_cv: float = 0.02
    seed: int = 0
    workers: int = 0                       # processes for simulation; 0 = every local core

    def __post_init__(self):
        for p in self.policies:
            if p not in POLICY_CHOICES:
                raise PlanError(f"policy {p!r}: choose from {', '.join(POLICY_CHOICES)}")
        if not self.policies or not self.nm_values or not self.staleness_values:
            raise PlanError("search: give at least one policy, one Nm and one staleness bound")
        if any(n < 1 for n in self.nm_values) or any(d < 0 for d in self.staleness_values):
            raise PlanError("search: Nm must be >= 1 and staleness bounds >= 0")
        if self.schedule not in SCHEDULES:
            raise PlanError(f"schedule {self.schedule!r}: choose from {', '.join(SCHEDULES)}")
        if self.top_k < 1 or self.margin < 0:
            raise PlanError("search: top_k must be >= 1 and margin >= 0")


@dataclass(frozen=True, kw_only=True)
class Candidate:
    policy: str
    nm: int
    staleness: int
    plan: Plan | None = None
    partitions: tuple[VwPartition, ...] = ()
    estimate: Estimate | None = None
    reason: str = ""                       # why it cannot run, when plan is None
    simulated_mb_s: float | None = None
    memory_bytes: dict[str, int] = field(default_factory=dict, compare=False)

    @property
    def feasible(self) -> bool:
        return self.plan is not None

    @property
    def predicted_mb_s(self) -> float:
        if self.simulated_mb_s is not None:
            return self.simulated_mb_s
        return self.estimate.minibatches_per_s if self.estimate else 0.0


@dataclass(frozen=True, kw_only=True)
class SearchResult:
    candidates: tuple[Candidate, ...]      # ranked: simulated, then estimated only, then infeasible
    simulated: int

    @property
    def best(self) -> Candidate:
        return self.candidates[0]


Progress = Callable[[str, int], object]    # (description, total) -> a bar with update(n)


def search_plans(cluster: Cluster, profile: ModelProfile, space: SearchSpace = SearchSpace(),
                 progress: Progress | None = None) -> SearchResult:
    """Rank whole plans for `profile` (already at the minibatch size wanted) on `cluster`."""
    missing = sorted(set(cluster.gpu_types) - profile.gpu_types)
    if missing:
        raise PlanError(f"profile {profile.model}: no layer times for GPU type(s) {', '.join(missing)} of "
                        f"cluster {cluster.name} (it has: {', '.join(sorted(profile.gpu_types))})")
    candidates = _enumerate(cluster, profile, space, progress)
    feasible = [c for c in candidates if c.feasible]
    if not feasible:
        raise PlanError(_nothing_fits(profile, candidates))
    feasible.sort(key=_estimate_key)
    best_estimate = feasible[0].estimate.minibatches_per_s
    chosen = [c for i, c in enumerate(feasible) if i < space.top_k
              or c.estimate.minibatches_per_s >= (1 - space.margin) * best_estimate]
    simulated = _simulate_all(cluster, profile, chosen, space, progress)
    simulated.sort(key=lambda c: -c.simulated_mb_s)       # stable: equal results keep estimate order
    rest = feasible[len(chosen):]
    infeasible = [c for c in candidates if not c.feasible]
    return SearchResult(candidates=tuple(simulated + rest + infeasible), simulated=len(simulated))


def _estimate_key(c: Candidate):
    return (-c.estimate.minibatches_per_s, c.staleness, c.nm)


def _bar(progress: Progress | None, desc: str, total: int):
    return progress(desc, total) if progress else nullcontext(None)


def _enumerate(cluster, profile, space, progress) -> list[Candidate]:
    topology = Topology(cluster)
    allocations: list[Allocation] = []
    for policy in space.policies:
        if policy != "horovod":
            allocations += [a for a in allocate(cluster, policy)
                            if all(a.groups != b.groups for b in allocations)]
    out: list[Candidate] = []
    cache: dict = {}
    with _bar(progress, "partition", len(allocations) * len(space.nm_values)) as bar:
        for alloc in allocations:
            for nm in space.nm_values:
                out += _candidates(cluster, profile, topology, alloc, nm, space, cache)
                if bar is not None:
                    bar.update(1)
    if "horovod" in space.policies:
        out.append(_horovod(cluster, profile, topology, space))
    return out


def _candidates(cluster, profile, topology, alloc, nm, space, cache) -> list[Candidate]:
    try:
        parts = [_partition(cluster, profile, topology, group, nm, space.schedule, cache)
                 for group in alloc.groups]
    except PlanError as exc:
        return [Candidate(policy=alloc.policy, nm=nm, staleness=0, reason=str(exc))]
    single = len(parts) == 1
    if single:
        estimate = Estimate(minibatches_per_s=vw_rate(parts[0], nm), bottleneck=parts[0].bottleneck_gpu)
    else:
        estimate = wsp_estimate(parts, nm, topology)
    out = []
    for d in ((0,) if single else space.staleness_values):
        sync = SyncSpec(mode="none") if single else SyncSpec(mode="wsp", staleness_bound=d)
        out.append(_checked(cluster, profile, alloc.policy, parts, nm, d, sync, space.schedule, estimate))
    return out


def _partition(cluster, profile, topology, group, nm, schedule, cache) -> VwPartition:
    """Partition a VW once per multiset of (GPU type, node) and Nm; VWs alike reuse it."""
    slots = [cluster.gpu(g) for g in group]
    key = (tuple(sorted((s.type.name, s.node) for s in slots)), nm, schedule)
    if key not in cache:
        try:
            cache[key] = partition_vw(profile, slots, topology, nm=nm, schedule=schedule,
                                      cache=cache.setdefault("tables", {}))
        except PlanError as exc:
            cache[key] = exc
    found = cache[key]
    if isinstance(found, PlanError):
        raise found
    return _relabel(found, slots, cluster)


def _relabel(part: VwPartition, slots: list[GpuSlot], cluster: Cluster) -> VwPartition:
    """The same partition on another set of GPUs with the same types and nodes."""
    free: dict[tuple, list[str]] = {}
    for s in sorted(slots, key=lambda s: s.id):
        free.setdefault((s.type.name, s.node), []).append(s.id)
    original: dict[tuple, list[str]] = {}
    for gid in sorted(part.gpus):
        slot = cluster.gpu(gid)
        original.setdefault((slot.type.name, slot.node), []).append(gid)
    mapping = {gid: free[key][i] for key, ids in original.items() for i, gid in enumerate(ids)}
    return replace(part, gpus=tuple(mapping[g] for g in part.gpus))


def _checked(cluster, profile, policy, parts, nm, d, sync, schedule, estimate) -> Candidate:
    plan = Plan(name=f"{policy.lower()}-nm{nm}-d{d}", model=profile.model, cluster=cluster.name,
                minibatch_size=profile.batch_size, nm=nm, schedule=schedule, sync=sync,
                notes=f"hetsim plan: policy {policy}",
                virtual_workers=tuple(VirtualWorker(name=f"vw{i}", stages=tuple(
                    StageSpec(gpu=g, layers=lh) for g, lh in zip(p.gpus, p.layers)))
                    for i, p in enumerate(parts)))
    base = Candidate(policy=policy, nm=nm, staleness=d, partitions=tuple(parts), estimate=estimate)
    try:
        memory = check_plan(plan, cluster, profile)
    except HetsimError as exc:
        return replace(base, reason=str(exc))
    return replace(base, plan=plan, memory_bytes={g: m.total_bytes for g, m in memory.items()})


def _horovod(cluster, profile, topology, space) -> Candidate:
    """Data parallelism on every GPU that holds the whole model with one minibatch in flight."""
    parts, reasons = [], []
    for slot in cluster.gpus:
        try:
            parts.append(partition_vw(profile, [slot], topology, nm=1, schedule="1f1b-flush"))
        except PlanError as exc:
            reasons.append(str(exc))
    if not parts:
        return Candidate(policy="horovod", nm=1, staleness=0, reason=reasons[0])
    ring = [p.gpus[0] for p in parts]
    # The ring's slowest hop (node interfaces, per-GPU rails and slower node-to-node paths included).
    ring_Bps = min((topology.bottleneck_Bps(a, b) for a, b in zip(ring, ring[1:] + ring[:1]) if a != b),
                   default=float("inf"))
    estimate = bsp_estimate(parts, 1, profile.param_bytes, ring_Bps)
    sync = SyncSpec(mode="bsp") if len(parts) > 1 else SyncSpec(mode="none")
    return _checked(cluster, profile, "horovod", parts, 1, 0, sync, "1f1b-flush", estimate)


def _simulate_all(cluster, profile, chosen, space, progress) -> list[Candidate]:
    jobs = [(cluster, profile, c.plan, space) for c in chosen]
    workers = min(space.workers or os.cpu_count() or 1, len(jobs))
    out = []
    with _bar(progress, "simulate", len(jobs)) as bar:
        if workers <= 1:
            results = map(_simulate, jobs)
            pool = None
        else:
            pool = ProcessPoolExecutor(max_workers=workers)
            results = pool.map(_simulate, jobs)
        try:
            for c, rate in zip(chosen, results):
                out.append(replace(c, simulated_mb_s=rate))
                if bar is not None:
                    bar.update(1)
        finally:
            if pool is not None:
                pool.shutdown()
    return out


def _simulate(job) -> float:
    """Steady-state minibatches per second of one plan (in a worker process).

    n_VW times the slowest VW's simulated rate: WSP holds every VW to the slowest one's pace in the
    long run, while a finite simulation lets faster VWs run up to D waves ahead and finish early,
    which would make a large D look faster than it is (../shared/reference/hetpipe.md).
    """
    from hetsim.sim import SimOptions, run_simulation
    cluster, profile, plan, space = job
    options = SimOptions(waves=space.waves, warmup_waves=space.warmup_waves, seed=space.seed,
                         jitter_cv=space.jitter_cv, trace=False)
    report = run_simulation(cluster, profile, plan, options)
    return len(report.virtual_workers) * min(v.minibatches_per_s for v in report.virtual_workers)


def _nothing_fits(profile: ModelProfile, candidates: list[Candidate]) -> str:
    first = candidates[0].reason if candidates else "no candidates"
    return (f"{profile.model} (minibatch {profile.batch_size}) does not fit: none of {len(candidates)} "
            f"candidate plans can hold it; e.g. {candidates[0].policy}: {first}")
