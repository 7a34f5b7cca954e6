"""Check a plan against a cluster and a profile: one place for every rule a runnable plan obeys."""

from __future__ import annotations

from hetsim.cluster import Cluster
from hetsim.errors import PlanError
from hetsim.memory import GIB, MemorySettings, StageMemory, stage_memory
from hetsim.plan import ASYNC_SCHEDULES, Plan, VirtualWorker
from hetsim.profile import ModelProfile, tp_divides
from hetsim.schedule import Schedule, build_schedule, schedule_kind
from hetsim.schedule.registry import FLUSH_SCHEDULES
from hetsim.topology import Topology

__all__ = ["check_plan", "check_structure", "plan_memory", "vw_schedule"]


def check_plan(plan: Plan, cluster: Cluster, profile: ModelProfile,
               slowdown: dict[str, float] | None = None) -> dict[str, StageMemory]:
    """Raise PlanError naming the first broken rule; return each GPU's memory use if all hold.

    `profile` must already be at the plan's minibatch size (see ModelProfile.scaled_to_batch);
    `slowdown` (GPU id -> factor) as the run will have it, for the orders shaped by costs.
    """
    check_structure(plan, cluster, profile.n_layers, f"the profile of {profile.model}")
    for v, vw in enumerate(plan.virtual_workers):
        for s, stage in enumerate(vw.stages):
            profile.require_gpu_type(cluster.gpu(stage.gpu).type.name)
            if not tp_divides(profile, stage.tp):
                raise PlanError(f"plan: virtual_workers[{v}].stages[{s}]: {stage.tp} tensor-parallel GPUs cannot "
                                f"split {profile.model}'s attention heads; a degree must divide "
                                f"{profile.tp_divisor} (the profile's tp_divisor)")
    memory = plan_memory(plan, cluster, profile, slowdown)
    for vw in plan.virtual_workers:
        for s, stage in enumerate(vw.stages):
            for member in stage.members:
                gpu = cluster.gpu(member)
                need = memory[member]
                if need.total_bytes > gpu.type.memory_bytes:
                    raise PlanError(
                        f"plan: stage {s} of {vw.name} on {gpu.id} ({gpu.type.display_name}, "
                        f"{gpu.type.memory_gib:.1f} GiB) needs {need.total_bytes / GIB:.2f} GiB "
                        f"({need.describe()}); lower Nm, add a stage or raise tensor parallelism")
    return memory


def vw_schedule(plan: Plan, vw: VirtualWorker, cluster: Cluster, profile: ModelProfile,
                waves: int, topology: Topology | None = None, slowdown: dict[str, float] | None = None) -> Schedule:
    """One virtual worker's schedule IR; the hetpipe order is shaped by its stages' costs, each stage's
    compute x its GPU's `slowdown` factor, a tensor-parallel group's slowest member's (as the run it
    orders would see them; as `hetsim plan --slowdown` costs them). `topology`: the cluster's, when
    the caller has one (building it costs O(GPUs) per call)."""
    costs = None
    if schedule_kind(plan.schedule).needs_costs:
        topology = topology or Topology(cluster)
        costs = []
        for s, stage in enumerate(vw.stages):
            times = profile.stage_times_tp(cluster.gpu(stage.gpu).type.name, *stage.layers, stage.tp,
                                           plan.recompute)
            # A tensor-parallel group computes in lockstep, at its slowest member's pace.
            factor = max((slowdown or {}).get(g, 1.0) for g in stage.members)
            fwd, bwd = times.fwd_s * factor, times.bwd_s * factor
            comm = 0.0
            if s + 1 < len(vw.stages):
                nxt = vw.stages[s + 1].gpu
                comm = (topology.route(stage.gpu, nxt).latency_s
                        + profile.cut_bytes(stage.layers[1]) * plan.activation_scale
                        / topology.bottleneck_Bps(stage.gpu, nxt))
            costs.append((fwd, bwd, comm))
        costs = tuple(costs)
    return build_schedule(plan.schedule, vw.n_devices, plan.nm, waves, plan.sync.mode, costs, vw.chunks)


_MEMORY_WAVES = (4, 8, 16, 32, 64)    # schedule lengths tried for the steady state


def plan_memory(plan: Plan, cluster: Cluster, profile: ModelProfile,
                slowdown: dict[str, float] | None = None) -> dict[str, StageMemory]:
    """Peak memory of every GPU in the plan, from the in-flight counts its schedule reaches in steady
    state: a schedule of 4 waves, lengthened while a longer one holds more (a schedule shaped by costs
    can take several waves to fill), so that whether a plan fits is the plan's, not a run's length.
    A schedule shaped by costs is the one `slowdown` (GPU id -> factor) orders: a slowed stage can
    leave the stages before it more minibatches in flight."""
    memory = _plan_memory(plan, cluster, profile, _MEMORY_WAVES[0], slowdown)
    if not schedule_kind(plan.schedule).needs_costs:
        return memory                      # a fixed order holds its most within its first wave
    for longer in _MEMORY_WAVES[1:]:
        more = _plan_memory(plan, cluster, profile, longer, slowdown)
        if all(more[g].total_bytes <= memory[g].total_bytes for g in more):
            break
        memory = more
    return memory


def _plan_memory(plan: Plan, cluster: Cluster, profile: ModelProfile, waves: int,
                 slowdown: dict[str, float] | None = None) -> dict[str, StageMemory]:
    out = {}
    settings = MemorySettings.of(plan)
    topology = Topology(cluster) if schedule_kind(plan.schedule).needs_costs else None
    for vw in plan.virtual_workers:
        schedule = vw_schedule(plan, vw, cluster, profile, waves, topology, slowdown)
        for d in range(schedule.n_stages):
            # A device's chunks (one unless virtual stages), each with what it holds at the device's peak.
            chunks = [vw.stages[schedule.virtual_stage(d, c)] for c in range(schedule.chunks)]
            for member in chunks[0].members:
                out[member] = _summed([stage_memory(profile, *stage.layers, in_flight=live, deferred=deferred,
                                                    asynchronous=plan.schedule in ASYNC_SCHEDULES,
                                                    settings=settings, tp=stage.tp,
                                                    reserve_bytes=cluster.gpu(member).type.framework_reserve_bytes)
                                       for stage, live, deferred in zip(chunks, schedule.live_at_peak(d),
                                                                        schedule.deferred_at_peak(d))])
    return out


def _summed(parts: list[StageMemory]) -> StageMemory:
    """One GPU holding several model chunks: their bytes add up; the framework reserve counts once."""
    if len(parts) == 1:
        return parts[0]
    return StageMemory(**{f: sum(getattr(p, f) for p in parts) for f in StageMemory.__dataclass_fields__
                          if f not in ("reserve_bytes", "tp", "versions")},
                       versions=parts[0].versions, reserve_bytes=parts[0].reserve_bytes, tp=parts[0].tp)


def check_structure(plan: Plan, cluster: Cluster | None, n_layers: int, model: str = "the model") -> None:
    """Raise PlanError naming the field of the first rule broken that needs no costs: each GPU exists
    and is used once, each VW's stages tile the `n_layers` layers of `model`, tensor-parallel groups
    sit in one node, the sync mode fits the schedule and the cluster. simulate, plan, validate and the
    executor all run this before any work. `cluster` None skips the rules about the cluster (validate
    maps the plan onto this host, whose cluster is known only after measuring it)."""
    seen: dict[str, str] = {}
    for v, vw in enumerate(plan.virtual_workers):
        end = 0
        for s, stage in enumerate(vw.stages):
            field, where = f"plan: virtual_workers[{v}].stages[{s}]", f"{vw.name} stage {s}"
            for member in stage.members:
                if member in seen and not _chunk_of_same_device(plan, vw, s, member):
                    raise PlanError(f"{field}.gpu: {where}: GPU {member} is already used by {seen[member]}; "
                                    "a GPU runs one stage")
                seen[member] = where
            if cluster is not None:
                for k, member in enumerate(stage.members):
                    try:
                        cluster.gpu(member)
                    except PlanError as exc:      # named at its field, as the other rules are
                        at = f"{field}.gpus[{k}]" if stage.tp_gpus else f"{field}.gpu"
                        raise PlanError(f"{at}: {where}: {str(exc)}") from None
                _check_tp_group(f"{field} ({where})", stage, cluster)
            lo, hi = stage.layers
            if lo != end:
                raise PlanError(f"{field}.layers: {where}: layers [{lo}, {hi}) must start at {end}, where the "
                                "previous stage ended (stages are contiguous)")
            end = hi
        if end != n_layers:
            raise PlanError(f"plan: virtual_workers[{v}].stages: {vw.name} covers layers [0, {end}) but "
                            f"{model} has {n_layers} layers; the last stage must end at layer {n_layers}")
    _check_sync(plan)
    if cluster is not None:
        _check_parameter_servers(plan, cluster)


def _check_tp_group(where: str, stage, cluster: Cluster) -> None:
    """A tensor-parallel group all-reduces inside every layer, so it lives in one node, on one GPU type."""
    lead = cluster.gpu(stage.gpu)
    for member in stage.tp_gpus:
        gpu = cluster.gpu(member)
        if gpu.node != lead.node:
            raise PlanError(f"{where}: tensor-parallel group {list(stage.members)} spans nodes "
                            f"{lead.node} and {gpu.node}; a group must be inside one node")
        if gpu.type.name != lead.type.name:
            raise PlanError(f"{where}: tensor-parallel group {list(stage.members)} mixes GPU types "
                            f"{lead.type.name} and {gpu.type.name}")


def _check_parameter_servers(plan: Plan, cluster: Cluster) -> None:
    """WSP with default placement shards its servers over the cluster's parameter_servers: with none
    there would be no synchronisation at all (each VW would train its own replica)."""
    if plan.sync.mode == "wsp" and plan.sync.ps_placement == "default" and not cluster.ps_nodes:
        raise PlanError(f"plan: sync.mode: wsp places its parameter servers on the cluster's parameter_servers, "
                        f"and cluster {cluster.name} lists none; name at least one node there")


def _chunk_of_same_device(plan: Plan, vw: VirtualWorker, s: int, gpu: str) -> bool:
    """Schedules with virtual stages list p x v stages: stage s runs on the GPU of stage s mod p."""
    if not schedule_kind(plan.schedule).virtual_stages:
        return False
    _check_round_robin(plan, plan.virtual_workers.index(vw), vw)
    return True


def _check_round_robin(plan: Plan, v: int, vw: VirtualWorker) -> None:
    p = vw.n_devices
    gpus = [s.gpu for s in vw.stages]
    if len(gpus) % p or gpus != gpus[:p] * (len(gpus) // p):
        raise PlanError(f"plan: virtual_workers[{v}].stages: {plan.schedule} lists p x v virtual stages with "
                        f"the GPUs repeating round-robin (stage j on the GPU of stage j mod p); got {gpus}")


def _check_schedule_rules(plan: Plan) -> None:
    """The schedule's own rules from its registry entry: sync modes, and the virtual-stage layout."""
    kind = schedule_kind(plan.schedule)
    if plan.sync.mode not in kind.sync_modes:
        raise PlanError(f"plan: sync.mode: {plan.sync.mode} is not supported by schedule {plan.schedule}; "
                        f"use {' or '.join(kind.sync_modes)}")
    for v, vw in enumerate(plan.virtual_workers):
        if kind.one_gpu_stages and any(s.tp > 1 for s in vw.stages):
            raise PlanError(f"plan: virtual_workers[{v}].stages: {plan.schedule} with tensor-parallel stages "
                            "is not supported; give each stage one GPU")
        if not kind.virtual_stages:
            continue
        _check_round_robin(plan, v, vw)
        p = vw.n_devices
        if plan.nm % p:
            raise PlanError(f"plan: nm: {plan.schedule} needs Nm a multiple of the {p} devices of {vw.name} "
                            f"(Megatron's order works in groups of one minibatch per device); got {plan.nm}")


def _check_sync(plan: Plan) -> None:
    _check_schedule_rules(plan)
    mode, schedule = plan.sync.mode, plan.schedule
    if mode == "bsp" and schedule in ASYNC_SCHEDULES:
        raise PlanError(f"plan: sync bsp needs a flush schedule ({', '.join(FLUSH_SCHEDULES)}), not {schedule}")
    if mode in ("bsp", "sdpipe"):
        first = [s.layers for s in plan.virtual_workers[0].stages]
        for vw in plan.virtual_workers[1:]:
            if [s.layers for s in vw.stages] != first:
                raise PlanError(f"plan: sync {mode} averages stage by stage, so every virtual worker "
                                f"needs the same layer ranges; {vw.name} differs from "
                                f"{plan.virtual_workers[0].name}")
    if mode == "wsp" and schedule in ASYNC_SCHEDULES:
        if plan.sync.offset_for(schedule) + plan.sync.staleness_bound < 1 and plan.nm > 1:
            raise PlanError(f"plan: sync.pull_offset 0 with staleness_bound 0 deadlocks the {schedule} "
                            "schedule (a wave starts before the previous one ends); use pull_offset >= 1")
    if mode in ("wsp", "sdpipe") and any(s.tp > 1 for vw in plan.virtual_workers for s in vw.stages):
        raise PlanError(f"plan: sync {mode} with tensor-parallel stages is not modelled (its pushes and group "
                        "averages move whole stages from one GPU, not each member's shard); use sync bsp or none")
    if mode == "none" and len(plan.virtual_workers) > 1:
        raise PlanError("plan: sync mode 'none' with several virtual workers would train independent "
                        "replicas; choose wsp, bsp or sdpipe")
