"""Check a plan against a cluster and a profile: one place for every rule a runnable plan obeys."""

from __future__ import annotations

from hetsim.cluster import Cluster
from hetsim.errors import PlanError
from hetsim.memory import GIB, MemorySettings, StageMemory, stage_memory
from hetsim.plan import ASYNC_SCHEDULES, Plan, VirtualWorker
from hetsim.profile import ModelProfile
from hetsim.schedule import Schedule, build_schedule
from hetsim.topology import Topology

__all__ = ["check_plan", "plan_memory", "vw_schedule"]


def check_plan(plan: Plan, cluster: Cluster, profile: ModelProfile, waves: int = 4) -> dict[str, StageMemory]:
    """Raise PlanError naming the first broken rule; return each GPU's memory use if all hold.

    `profile` must already be at the plan's minibatch size (see ModelProfile.scaled_to_batch).
    """
    _check_structure(plan, cluster, profile)
    _check_sync(plan)
    memory = plan_memory(plan, cluster, profile, waves)
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
                waves: int) -> Schedule:
    """One virtual worker's schedule IR; the hetpipe order is shaped by its stages' nominal costs."""
    costs = None
    if plan.schedule == "hetpipe":
        topology = Topology(cluster)
        costs = []
        for s, stage in enumerate(vw.stages):
            times = profile.stage_times_tp(cluster.gpu(stage.gpu).type.name, *stage.layers, stage.tp)
            fwd, bwd = times.fwd_s, times.bwd_s
            comm = 0.0
            if s + 1 < len(vw.stages):
                nxt = vw.stages[s + 1].gpu
                comm = (topology.route(stage.gpu, nxt).latency_s
                        + profile.cut_bytes(stage.layers[1]) / topology.bottleneck_Bps(stage.gpu, nxt))
            costs.append((fwd, bwd, comm))
        costs = tuple(costs)
    return build_schedule(plan.schedule, len(vw.stages), plan.nm, waves, plan.sync.mode, costs)


def plan_memory(plan: Plan, cluster: Cluster, profile: ModelProfile, waves: int = 4) -> dict[str, StageMemory]:
    """Peak memory of every GPU in the plan, from the in-flight counts of its schedule."""
    out = {}
    settings = MemorySettings.of(plan)
    for vw in plan.virtual_workers:
        schedule = vw_schedule(plan, vw, cluster, profile, waves)
        for s, stage in enumerate(vw.stages):
            for member in stage.members:
                out[member] = stage_memory(profile, *stage.layers, in_flight=schedule.in_flight(s),
                                           asynchronous=plan.schedule in ASYNC_SCHEDULES,
                                           settings=settings, tp=stage.tp,
                                           reserve_bytes=cluster.gpu(member).type.framework_reserve_bytes)
    return out


def _check_structure(plan: Plan, cluster: Cluster, profile: ModelProfile) -> None:
    seen: dict[str, str] = {}
    for vw in plan.virtual_workers:
        end = 0
        for s, stage in enumerate(vw.stages):
            where = f"plan: {vw.name} stage {s}"
            gpu = cluster.gpu(stage.gpu)
            for member in stage.members:
                if member in seen:
                    raise PlanError(f"{where}: GPU {member} is already used by {seen[member]}")
                seen[member] = f"{vw.name} stage {s}"
            _check_tp_group(where, stage, cluster)
            profile.require_gpu_type(gpu.type.name)
            lo, hi = stage.layers
            if lo != end:
                raise PlanError(f"{where}: layers [{lo}, {hi}) must start at {end}, where the previous "
                                "stage ended (stages are contiguous)")
            end = hi
        if end != profile.n_layers:
            raise PlanError(f"plan: {vw.name} covers layers [0, {end}) but the profile of "
                            f"{profile.model} has {profile.n_layers} layers")


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


def _check_sync(plan: Plan) -> None:
    mode, schedule = plan.sync.mode, plan.schedule
    if mode == "bsp" and schedule in ASYNC_SCHEDULES:
        raise PlanError(f"plan: sync bsp needs a flush schedule (gpipe or 1f1b-flush), not {schedule}")
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
