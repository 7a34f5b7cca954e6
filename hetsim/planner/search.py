"""Whole-plan search: allocations x Nm x D, bounded, estimated in closed form, ranked by the simulator.

Every candidate (an allocation at one Nm and D) starts as an upper bound of its estimate; the
partitions and the estimate are computed only when that bound reaches the top of a priority queue
(`hetsim.planner.bounds`), so estimates come out best first without estimating what is never
reached. VWs of one shape share one partition (`hetsim.planner.memo`); with sync bsp or sdpipe,
which average stage by stage, every VW of a candidate gets the same layer ranges. Each tensor-parallel
degree in `tp_values` adds the same search on groups of that many GPUs (`hetsim.planner.tp_groups`).
Plans are built and checked by `hetsim.feasibility.check_plan` (the one place the memory and
structure rules live) best first, as far as the ranking shows them. On clusters of up to `sim_max_gpus` GPUs, candidates are then
simulated (on Dask workers, `hetsim.fanout`; results in submission order, so the ranking is
deterministic): the `top_k` best estimates, those within `margin` of the best, and every candidate
whose rate bound could still beat the best simulated rate (branch and bound), which finds the plan
that simulating every candidate finds (`exhaustive=True`, kept as the reference). Larger clusters
are ranked by the estimate. Candidates that cannot run keep the reason.
"""

from __future__ import annotations

import math
from collections import Counter

from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from typing import Callable

from hetsim.cluster import Cluster
from hetsim.convergence import Dynamics, dynamics_of, vw_busy
from hetsim.errors import HetsimError, NoSteadyStateError, PlanError
from hetsim.fields import is_real, is_whole
from hetsim.feasibility import check_plan
from hetsim.memory import MemorySettings
from hetsim.plan import OPTIMIZERS, PRECISIONS, Plan, StageSpec, SyncSpec, VirtualWorker
from hetsim.planner.allocation import Allocation, allocate
from hetsim.planner.bounds import LazyEstimate, best_first, shape_bound
from hetsim.planner.estimate import Estimate, PsRoutes, bsp_estimate, rate_bound
from hetsim.planner.hetero import VwPartition
from hetsim.planner.memo import PartitionMemo
from hetsim.planner.tp_groups import tp_view
from hetsim.profile import ModelProfile, tp_divides
from hetsim.schedule.registry import schedule_kind
from hetsim.topology import Topology
from hetsim.units import MAX_JITTER_CV

__all__ = ["SearchSpace", "Candidate", "SearchResult", "search_plans", "POLICY_CHOICES", "SIM_MAX_GPUS"]

POLICY_CHOICES = ("NP", "ED", "HD", "auto", "horovod")


# Clusters above this many GPUs are ranked by the closed-form estimate alone (SearchSpace.sim_max_gpus).
SIM_MAX_GPUS = 32


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
    scheduler: str | None = None           # a running Dask scheduler's address, instead of local workers
    sync: str = "wsp"                      # how the VWs of multi-VW candidates synchronise: wsp, bsp, sdpipe
    # Tensor-parallel degrees: each pipeline stage a group of t GPUs of one node (`tp_groups`). WSP and
    # SDPipe do not model TP stages, so with them t > 1 only tries single-VW allocations.
    tp_values: tuple[int, ...] = (1,)
    # How the plans train, which sets what a stage keeps in memory and the bytes an activation moves;
    # the plans written carry it. optimizer None: the plan format's default, one FP32 optimizer copy
    # per weight (SGD with momentum). Layer times are the profile's: profile at this precision.
    precision: str = "fp32"
    optimizer: str | None = None
    recompute: bool = False
    # Today's reference search: simulate every feasible candidate. The default simulates only on
    # clusters of at most `sim_max_gpus` GPUs, best estimate first, skipping candidates whose rate
    # bound (raised by `bound_slack`) is below the best simulated rate: the same best plan, fewer
    # simulations. Larger clusters are ranked by the estimate alone (a full simulation of 64 VWs
    # takes tens of seconds).
    exhaustive: bool = False
    bound_slack: float = 0.03              # how far a simulation may beat the bound (jitter, finite window)
    sim_max_gpus: int = SIM_MAX_GPUS
    keep: int = 20                         # plans built and checked beyond the simulated ones, best first

    def __post_init__(self):
        for name in ("policies", "nm_values", "staleness_values", "tp_values"):
            values = getattr(self, name)
            if isinstance(values, str) or not isinstance(values, (tuple, list)):
                raise PlanError(f"search: {name}: expected a tuple of values, got {values!r}")
            if name != "policies" and not all(is_whole(v) for v in values):
                raise PlanError(f"search: {name}: expected whole numbers, got {list(values)}")
        for name in ("margin", "jitter_cv", "bound_slack"):
            value = getattr(self, name)
            if not is_real(value) or not math.isfinite(value):
                raise PlanError(f"search: {name}: expected a finite number, got {value!r}")
        for name in ("top_k", "keep", "sim_max_gpus", "waves", "warmup_waves", "seed", "workers"):
            value = getattr(self, name)
            if not is_whole(value) or value < 0:
                raise PlanError(f"search: {name}: expected a whole number >= 0, got {value!r}")
        # SimOptions' own rules, checked here too: the planner does not load the simulator (simpy) to
        # build its space, and a bad value should stop the search before any simulation is fanned out.
        if not 0 <= self.jitter_cv <= MAX_JITTER_CV:
            raise PlanError(f"search: jitter_cv: must be in [0, {MAX_JITTER_CV:g}], got {self.jitter_cv}")
        if not 0 <= self.warmup_waves < self.waves:
            raise PlanError(f"search: waves {self.waves}, warmup_waves {self.warmup_waves}: need warmup_waves < waves, "
                            "so that some waves are timed")
        for p in self.policies:
            if p not in POLICY_CHOICES:
                raise PlanError(f"policy {p!r}: choose from {', '.join(POLICY_CHOICES)}")
        if not self.policies or not self.nm_values or not self.staleness_values:
            raise PlanError("search: give at least one policy, one Nm and one staleness bound")
        if any(n < 1 for n in self.nm_values) or any(d < 0 for d in self.staleness_values):
            raise PlanError("search: Nm must be >= 1 and staleness bounds >= 0")
        if not self.tp_values or any(t < 1 for t in self.tp_values):
            raise PlanError(f"search: tp_values {list(self.tp_values)}: give tensor-parallel degrees >= 1")
        schedule_kind(self.schedule)         # refuses an unknown name, listing the known ones
        if self.precision not in PRECISIONS:
            raise PlanError(f"search: precision {self.precision!r}: choose from {', '.join(PRECISIONS)}")
        if self.optimizer is not None and self.optimizer not in OPTIMIZERS:
            raise PlanError(f"search: optimizer {self.optimizer!r}: choose from {', '.join(OPTIMIZERS)}")
        if self.sync not in ("wsp", "bsp", "sdpipe"):
            raise PlanError(f"sync {self.sync!r}: choose from wsp, bsp, sdpipe")
        if self.top_k < 1 or self.margin < 0:
            raise PlanError("search: top_k must be >= 1 and margin >= 0")
        if self.bound_slack < 0 or self.sim_max_gpus < 0 or self.keep < 0:
            raise PlanError("search: bound_slack, sim_max_gpus and keep must be >= 0")

    @property
    def memory(self) -> MemorySettings:
        return MemorySettings(optimizer=self.optimizer, precision=self.precision, recompute=self.recompute)


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
    # What its simulation did to the optimisation (staleness, update batch), for time to accuracy.
    dynamics: Dynamics | None = field(default=None, compare=False)
    not_simulated: str = ""                # why its simulation could not time it (it keeps its estimate)
    memory_bytes: dict[str, int] = field(default_factory=dict, compare=False)
    in_flight: int = 0                     # most minibatches in flight on one stage of its schedule
    sync: SyncSpec | None = None           # what the plan will use, once built
    schedule: str = ""
    tp_groups: dict[str, tuple[str, ...]] = field(default_factory=dict, compare=False)   # lead -> TP group

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
    pruned: int = 0                        # estimated below every listed one: never built nor checked
    skipped: tuple[str, ...] = ()          # search dimensions that built no candidate, and why

    @property
    def best(self) -> Candidate:
        return self.candidates[0]


Progress = Callable[[str, int], object]    # (description, total) -> a bar with update(n)


def search_plans(cluster: Cluster, profile: ModelProfile, space: SearchSpace = SearchSpace(),
                 progress: Progress | None = None) -> SearchResult:
    """Rank whole plans for `profile` (already at the minibatch size wanted) on `cluster`."""
    for name, value, kind in (("cluster", cluster, Cluster), ("profile", profile, ModelProfile),
                              ("space", space, SearchSpace)):
        if not isinstance(value, kind):
            raise PlanError(f"search_plans: {name}: expected a {kind.__name__} (hetsim.load_{name} reads one)"
                            if name != "space" else f"search_plans: space: expected a SearchSpace, got "
                            f"{type(value).__name__}")
    missing = sorted(set(cluster.gpu_types) - profile.gpu_types)
    if missing:
        raise PlanError(f"profile {profile.model}: no layer times for GPU type(s) {', '.join(missing)} of "
                        f"cluster {cluster.name} (it has: {', '.join(sorted(profile.gpu_types))})")
    idle = [t for t in sorted(cluster.gpu_types) if not any(l.fwd_s.get(t) or l.bwd_s.get(t) for l in profile.layers)]
    if idle:
        raise PlanError(f"profile {profile.model}: every layer takes 0 s on {', '.join(idle)}: the search ranks "
                        "plans by time, which such a profile does not give")
    pending, skipped = _enumerate(cluster, profile, space, progress)
    realised = _Realised(cluster, profile, pending, space)
    if space.exhaustive:
        realised.take(len(pending))
        realised.feasible = _simulate_all(cluster, profile, realised.feasible, space, progress)
        simulated = _timed(realised.feasible)
    else:
        simulated = _bounded(cluster, profile, realised, space, progress)
        realised.take(len(simulated) + space.keep)
    if not realised.feasible:
        raise PlanError(_nothing_fits(profile, realised.failed + realised.unfit, skipped))
    simulated.sort(key=lambda c: -c.simulated_mb_s)       # stable: equal results keep estimate order
    rest = [c for c in realised.feasible if c.simulated_mb_s is None]
    return SearchResult(candidates=tuple(simulated + rest + realised.failed + realised.unfit),
                        simulated=len(simulated), pruned=len(pending) - realised.seen, skipped=skipped)


def _bar(progress: Progress | None, desc: str, total: int):
    return progress(desc, total) if progress else nullcontext(None)


@dataclass(frozen=True)
class _Pending:
    """A candidate before its plan is built: the allocation at one Nm (shared by its D variants)."""
    policy: str
    staleness: int
    sync: SyncSpec
    schedule: str
    lazy: LazyEstimate
    tp_groups: dict = field(default_factory=dict)


class _Realised:
    """Candidates turned into checked plans lazily, best estimate first (`best_first`): building
    and checking a plan of hundreds of GPUs costs more than estimating it, and most candidates are
    never shown."""

    def __init__(self, cluster: Cluster, profile: ModelProfile, pending: list[_Pending], space: SearchSpace):
        self.cluster, self.profile, self.pending, self.space = cluster, profile, pending, space
        self.ranked = best_first([(p.lazy, p.staleness, p.lazy.nm) for p in pending])
        self.feasible: list[Candidate] = []
        self.failed: list[Candidate] = []                 # partitioned, but the plan check refused it
        self.unfit: list[Candidate] = []                  # no partition fits (one per allocation and Nm)
        self.seen = 0

    def take(self, n_feasible: int) -> None:
        """Realise candidates until `n_feasible` of them hold up or none are left."""
        while len(self.feasible) < n_feasible:
            i, lazy = next(self.ranked, (None, None))
            if i is None:
                return
            p = self.pending[i]
            if lazy is None:
                self.unfit.append(Candidate(policy=p.policy, nm=p.lazy.nm, staleness=0, reason=str(p.lazy.error)))
                self.seen += sum(q.lazy is p.lazy for q in self.pending)
                continue
            c = _checked(self.cluster, self.profile, self.space, Candidate(
                policy=p.policy, nm=lazy.nm, staleness=p.staleness, partitions=tuple(lazy.parts),
                estimate=lazy.estimate(), sync=p.sync, schedule=p.schedule, tp_groups=p.tp_groups))
            self.seen += 1
            (self.feasible if c.feasible else self.failed).append(c)


# Candidates simulated per round of the bounded search: fixed, not the worker count, so that the
# same candidates are simulated (and the same ranking printed) on one core or many.
_BATCH = 2


def _bounded(cluster, profile, realised: _Realised, space: SearchSpace, progress) -> list[Candidate]:
    """Branch and bound over simulations, on clusters small enough to simulate (`sim_max_gpus`):
    simulate the `top_k` best estimates and those within `margin` of the best (what the search
    always simulated), then, best estimate first, every other candidate whose `rate_bound` (raised by `bound_slack` for jitter and the
    finite window) is not below the best simulated rate so far. The best plan is then the one
    simulating everything finds. Larger clusters are ranked by the estimate alone."""
    if len(cluster.gpus) > space.sim_max_gpus:
        return []
    realised.take(len(realised.pending))
    feasible = realised.feasible
    bound = [rate_bound(list(c.partitions), c.nm, summed=c.sync.mode == "sdpipe") * (1 + space.bound_slack)
             for c in feasible]
    top = feasible[0].estimate.minibatches_per_s if feasible else 0.0
    asked = {i for i, c in enumerate(feasible)           # what top_k and margin ask for, as before
             if i < space.top_k or c.estimate.minibatches_per_s >= (1 - space.margin) * top}
    done: dict[int, Candidate] = {}
    best = 0.0
    batch = sorted(asked)                                  # one fan-out, as many workers as help
    while batch:
        for i, c in zip(batch, _simulate_all(cluster, profile, [feasible[i] for i in batch], space, progress)):
            done[i] = c
            best = max(best, c.simulated_mb_s or 0.0)
        batch = [i for i in range(len(feasible)) if i not in done and bound[i] >= best][:_BATCH] if best else []
    realised.feasible = [done.get(i, c) for i, c in enumerate(feasible)]
    return _timed([done[i] for i in sorted(done)])


def _timed(simulated: list[Candidate]) -> list[Candidate]:
    """The candidates whose simulation timed a steady state; none of them, when some were simulated,
    is an error: the ranking would be the estimate's alone, for want of waves."""
    timed = [c for c in simulated if c.simulated_mb_s is not None]
    if simulated and not timed:
        c = simulated[0]
        raise PlanError(f"none of the {len(simulated)} simulated candidates had a steady state to time, e.g. "
                        f"{c.policy} Nm {c.nm} D {c.staleness}: {c.not_simulated}")
    return timed


def _enumerate(cluster, profile, space, progress) -> tuple[list[_Pending], tuple[str, ...]]:
    """Every candidate with a bound of its estimate (partitions are made when the bound is reached),
    and the TP degrees that built none or fewer than their policies allow, with why."""
    unsplit = [t for t in space.tp_values if not tp_divides(profile, t)]
    if unsplit:
        raise PlanError(f"search: tensor-parallel degrees (--tp, tp_values) {','.join(map(str, space.tp_values))}: "
                        f"{profile.model}'s attention heads split only "
                        f"into degrees dividing {profile.tp_divisor}, not {', '.join(map(str, unsplit))}")
    views, skipped = [], []
    for tp in space.tp_values:
        view, members = (cluster, {}) if tp == 1 else tp_view(cluster, tp)
        if not view.nodes:
            skipped.append(f"TP {tp}: no node has {tp} GPUs of one type")
            continue
        allocations, dropped = _allocations(view, space, tp)
        if dropped:
            skipped.append(f"TP {tp}: {dropped} allocation(s) of several virtual workers left out: tensor-parallel "
                           f"stages run under --sync bsp, or as one virtual worker")
        if not allocations and not dropped:
            skipped.append(f"TP {tp}: policies {','.join(space.policies)} build no allocation of it (horovod "
                           "replicates the whole model on single GPUs)")
        views.append((tp, view, members, allocations))
    if not views:
        most = max(Counter(g.type.name for g in node.gpus).most_common(1)[0][1] for node in cluster.nodes)
        raise PlanError(f"search: tensor-parallel degrees (--tp, tp_values) {','.join(map(str, space.tp_values))}: "
                        f"a tensor-parallel group is GPUs of one type in "
                        f"one node, and no node of cluster {cluster.name} has that many (the most is {most})")
    pending: list[_Pending] = []
    bounds: dict = {}
    memos = {}
    with _bar(progress, "bound", sum(len(v[3]) for v in views) * len(space.nm_values)) as bar:
        for tp, view, members, allocations in views:
            topology = Topology(view)
            memo = memos[tp] = PartitionMemo(view, profile, topology, tp, space.memory)
            routes = PsRoutes(topology)
            for alloc in allocations:
                if tp > 1:
                    alloc = Allocation(policy=f"{alloc.policy}+TP{tp}", groups=alloc.groups)
                for nm in space.nm_values:
                    pending += [replace(p, tp_groups=members)
                                for p in _candidates(memo, topology, routes, alloc, nm, space, bounds)]
                    if bar is not None:
                        bar.update(1)
    if "horovod" in space.policies:
        memo = memos.get(1) or PartitionMemo(cluster, profile, Topology(cluster), memory=space.memory)
        pending += _horovod(memo, memo.topology)
    return pending, tuple(skipped)


def _allocations(cluster, space, tp: int) -> tuple[list[Allocation], int]:
    """The policies' allocations, each once; with TP groups and a sync that cannot run them, only
    the single-VW ones, and how many others were left out."""
    allocations: list[Allocation] = []
    seen: set = set()
    for policy in space.policies:
        if policy != "horovod":
            for a in allocate(cluster, policy):
                if a.groups not in seen:
                    seen.add(a.groups)
                    allocations.append(a)
    kept = [a for a in allocations if tp == 1 or space.sync == "bsp" or len(a.groups) == 1]
    return kept, len(allocations) - len(kept)


def _candidates(memo: PartitionMemo, topology, routes, alloc, nm, space, bounds: dict) -> list[_Pending]:
    types = lambda group: tuple(memo.slot(g).type.name for g in group)
    bound = len(alloc.groups) * min(shape_bound(memo.profile, types(g), nm, bounds, memo.tp) for g in alloc.groups)
    single = len(alloc.groups) == 1
    # BSP and SDPipe average stage by stage: every VW needs the same layer ranges.
    if not single and space.sync in ("bsp", "sdpipe"):
        parts = lambda: memo.aligned(alloc.groups, nm, space.schedule)
    else:
        parts = lambda: [memo.partition(g, nm, space.schedule) for g in alloc.groups]
    lazy = LazyEstimate(bound, parts, nm, topology, routes=routes, sync=space.sync)
    # Only WSP has a staleness bound; sdpipe candidates rank by the WSP estimate until simulated.
    return [_Pending(policy=alloc.policy, staleness=d, schedule=space.schedule, lazy=lazy,
                     sync=SyncSpec(mode="none") if single else SyncSpec(mode=space.sync, staleness_bound=d))
            for d in (space.staleness_values if not single and space.sync == "wsp" else (0,))]


def _checked(cluster, profile, space: SearchSpace, c: Candidate) -> Candidate:
    """The candidate with its plan built and checked by `check_plan`, or with why it cannot run."""
    plan = Plan(name=f"{c.policy.lower()}-nm{c.nm}-d{c.staleness}", model=profile.model, cluster=cluster.name,
                minibatch_size=profile.batch_size, nm=c.nm, schedule=c.schedule, sync=c.sync,
                precision=space.precision, optimizer=space.optimizer, recompute=space.recompute,
                notes=f"hetsim plan: policy {c.policy}",
                virtual_workers=tuple(VirtualWorker(name=f"vw{i}", stages=tuple(
                    StageSpec(gpu=g, tp_gpus=c.tp_groups.get(g, (g,))[1:], layers=lh)
                    for g, lh in zip(p.gpus, p.layers)))
                    for i, p in enumerate(c.partitions)))
    try:
        memory = check_plan(plan, cluster, profile)
    except HetsimError as exc:
        return replace(c, reason=str(exc))
    return replace(c, plan=plan, memory_bytes={g: m.total_bytes for g, m in memory.items()},
                   in_flight=max(m.in_flight for m in memory.values()))


def _horovod(memo: PartitionMemo, topology) -> list[_Pending]:
    """Data parallelism on every GPU that holds the whole model with one minibatch in flight."""
    parts, reasons = [], []
    for slot in memo.cluster.gpus:
        try:
            parts.append(memo.partition((slot.id,), 1, "1f1b-flush"))
        except PlanError as exc:
            reasons.append(str(exc))
    if not parts:
        lazy = LazyEstimate(0.0, lambda: _raise(PlanError(reasons[0])), 1, topology)
        return [_Pending(policy="horovod", staleness=0, sync=SyncSpec(mode="none"), schedule="1f1b-flush",
                         lazy=lazy)]
    ring = [p.gpus[0] for p in parts]
    # The ring's slowest hop (node interfaces, per-GPU rails and slower node-to-node paths included).
    ring_Bps = min((topology.bottleneck_Bps(a, b) for a, b in zip(ring, ring[1:] + ring[:1]) if a != b),
                   default=float("inf"))
    estimate = bsp_estimate(parts, 1, memo.profile.param_bytes, ring_Bps)
    lazy = LazyEstimate(estimate.minibatches_per_s, lambda: parts, 1, topology, estimate)
    sync = SyncSpec(mode="bsp") if len(parts) > 1 else SyncSpec(mode="none")
    return [_Pending(policy="horovod", staleness=0, sync=sync, schedule="1f1b-flush", lazy=lazy)]


def _raise(exc: Exception):
    raise exc


def _simulate_all(cluster, profile, chosen, space, progress) -> list[Candidate]:
    from hetsim.fanout import fan_out
    jobs = [(cluster, profile, c.plan, space) for c in chosen]
    with _bar(progress, "simulate", len(jobs)) as bar:
        runs = fan_out(_simulate, jobs, workers=space.workers or None, scheduler=space.scheduler, bar=bar)
    return [replace(c, simulated_mb_s=run.mb_s, dynamics=run.dynamics, not_simulated=run.error)
            for c, run in zip(chosen, runs)]


@dataclass(frozen=True)
class SimulatedRun:
    mb_s: float | None               # steady-state minibatches per second, as `hetsim simulate` reports it
    dynamics: Dynamics | None        # its update batch and staleness, so time to accuracy needs no second run
    error: str = ""                  # where the run had no steady state to time (mb_s None): why


def _simulate(job) -> SimulatedRun:
    """Steady-state rate of one plan (in a worker process), with what the run did to the optimisation.

    The report's rate, so the printed `hetsim simulate` command reproduces it: under WSP n_VW times the
    slowest VW's rate (the staleness bound holds every VW to its pace in the long run, while a finite
    run lets faster VWs lead by up to D waves, which would make a large D look faster than it is;
    hetsim.window locks it), under SDPipe the sum of the VWs' rates (a fast VW owes a connection only
    once per sdpipe_period of its waves, so it keeps its lead and its updates count).
    """
    from hetsim.sim import SimOptions, run_simulation
    cluster, profile, plan, space = job
    options = SimOptions(waves=space.waves, warmup_waves=space.warmup_waves, seed=space.seed,
                         jitter_cv=space.jitter_cv, trace=False)
    try:
        report = run_simulation(cluster, profile, plan, options)
    except NoSteadyStateError as exc:    # e.g. a VW so fast that it ends before the slowest warms up
        return SimulatedRun(mb_s=None, dynamics=None, error=str(exc))
    return SimulatedRun(mb_s=report.throughput["minibatches_per_s"],
                        dynamics=dynamics_of(report.plan, report.staleness, vw_busy(report.gpus)))


def _nothing_fits(profile: ModelProfile, candidates: list[Candidate], skipped: tuple[str, ...] = ()) -> str:
    if not candidates:
        why = f" ({'; '.join(skipped)})" if skipped else ""
        return (f"{profile.model} (minibatch {profile.batch_size}): the policies built no candidate plan on this "
                f"cluster{why}")
    return (f"{profile.model} (minibatch {profile.batch_size}) does not fit: none of {len(candidates)} "
            f"candidate plans can hold it; e.g. {candidates[0].policy}: {candidates[0].reason}")
