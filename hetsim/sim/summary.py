"""Turn a finished run's recordings into a Report (prediction)."""

from __future__ import annotations

from dataclasses import asdict

from hetsim.cluster import Cluster
from hetsim.errors import SimulationError
from hetsim.memory import StageMemory
from hetsim.plan import ASYNC_SCHEDULES, Plan
from hetsim.profile import ModelProfile
from hetsim.report import GpuStats, LinkStats, Report, VwStats, distribution
from hetsim.sim.pipeline import Stage
from hetsim.sim.recorder import Recorder
from hetsim.sim.world import World
from hetsim.window import steady_window

__all__ = ["build_report"]


def build_report(world: World, rec: Recorder, plan: Plan, cluster: Cluster, profile: ModelProfile,
                 options, memory: dict[str, StageMemory], stages: list[list[Stage]], sync) -> Report:
    start, end = rec.start, rec.end
    window = steady_window(rec.completion_times, rec.warmup, period=plan.nm)
    if start is None or end is None or end.t <= start.t or window is None:
        raise SimulationError(f"no steady-state window: no simulated time passed between the last virtual worker "
                              f"finishing its {options.warmup_waves} warm-up waves and the first finishing all "
                              f"{options.waves}; simulate more waves")
    span = end.t - start.t
    vws = [VwStats(name=vw.name, minibatches=window.minibatches(i), minibatches_per_s=window.rate(i),
                   samples_per_s=window.rate(i) * plan.minibatch_size,
                   sync_wait_s=end.vw_sync_wait[i] - start.vw_sync_wait[i])
           for i, vw in enumerate(plan.virtual_workers)]
    rate = sum(v.minibatches_per_s for v in vws)
    throughput = {"minibatches_per_s": rate, "samples_per_s": rate * plan.minibatch_size,
                  # a wave of Nm minibatches per virtual worker: one optimizer step under flush schedules
                  "iteration_s": plan.nm * len(vws) / rate}
    if profile.tokens_per_sample:
        throughput["tokens_per_s"] = rate * plan.minibatch_size * profile.tokens_per_sample
    return Report(
        kind="prediction", plan=plan.to_dict(), cluster=cluster.name, model=profile.model,
        profile_source=profile.source, settings=_settings(options, world),
        window={"start_s": start.t, "end_s": end.t, "duration_s": span},
        throughput=throughput,
        virtual_workers=vws, gpus=_gpus(world, plan, memory, stages, start, end, span),
        links=_links(world, start, end, span), staleness=_staleness(rec, plan, memory),
        sync=_sync(rec, plan, sync, start, end), notes=_notes(profile, options, cluster),
        staleness_local=rec.staleness_local, staleness_global=rec.staleness_global)


def _settings(options, world: World) -> dict:
    return {"waves": options.waves, "warmup_waves": options.warmup_waves, "seed": options.seed,
            "jitter_cv": options.jitter_cv, "slowdown": dict(sorted(options.slowdown.items())),
            "straggler_prob": options.straggler_prob, "straggler_delay_s": options.straggler_delay_s,
            "events": world.env.events_processed, "simulated_s": world.env.now}


def _gpus(world, plan, memory, stages, start, end, span) -> list[GpuStats]:
    out = []
    for vw_stages in stages:
        for st in vw_stages:
            for g in st.members or (st.gpu,):
                mem = memory[g]
                compute = end.compute[g] - start.compute[g]
                out.append(GpuStats(
                    id=g, type=world.cluster.gpu(g).type.name, vw=plan.virtual_workers[st.vw].name,
                    stage=st.index, layers=st.layers, busy_fraction=compute / span, compute_s=compute,
                    recv_wait_s=end.recv_wait[st.gpu] - start.recv_wait[st.gpu],
                    sync_wait_s=end.sync_wait[st.gpu] - start.sync_wait[st.gpu], memory_bytes=mem.total_bytes,
                    memory_capacity_bytes=world.cluster.gpu(g).type.memory_bytes,
                    memory_breakdown={k: v for k, v in asdict(mem).items() if k.endswith("_bytes")},
                    tp=len(st.members) if st.members else 1))
    return out


def _links(world: World, start, end, span) -> list[LinkStats]:
    caps = world.topology.capacity_Bps
    return [LinkStats(id=l, bandwidth_Bps=caps[l], bytes=end.carried[l] - start.carried[l],
                      utilisation=(end.carried[l] - start.carried[l]) / (caps[l] * span))
            for l in sorted(caps)]


def _staleness(rec: Recorder, plan: Plan, memory: dict[str, StageMemory]) -> dict:
    """Distributions over every minibatch (local) and every pushed update (global), with bounds:
    local <= in-flight - 1 under weight stashing; global <= D + pull_offset clocks under WSP."""
    asynchronous = plan.schedule in ASYNC_SCHEDULES
    out = {"local": distribution(r[3] for r in rec.staleness_local),
           "local_bound": max(m.in_flight for m in memory.values()) - 1 if asynchronous else 0}
    if plan.sync.mode == "wsp":
        out["global"] = distribution(r[4] for r in rec.staleness_global)
        out["global_bound"] = plan.sync.staleness_bound + plan.sync.offset_for(plan.schedule)
    return out


def _sync(rec: Recorder, plan: Plan, sync, start, end) -> dict:
    spec = plan.sync
    out: dict = {"mode": spec.mode}
    if spec.mode == "wsp":
        offset = spec.offset_for(plan.schedule)
        out.update(staleness_bound=spec.staleness_bound, pull_offset=offset,
                   ps_placement=spec.ps_placement,
                   shards=[{"node": s.node, "layers": list(s.layers), "fraction": s.fraction}
                           for s in sync.shards],
                   max_clock_gap=max(((w - offset) - c for _, _, w, _, c in rec.gates), default=0),
                   bound_wait_s={vw.name: sum(g[3] for g in rec.gates if g[0] == i and g[1] == 0)
                                 for i, vw in enumerate(plan.virtual_workers)},
                   final_clocks=list(sync.c_local))
    elif spec.mode == "sdpipe":
        sizes = [len(g) for groups in sync.groups for g in groups]
        out.update(period=spec.sdpipe_period, groups=len(sizes), group_size=distribution(sizes),
                   connections=sync.connections)
    return out


def _notes(profile: ModelProfile, options, cluster: Cluster) -> list[str]:
    notes = [f"profile: {profile.source}"]
    for node in cluster.nodes:
        if node.shared_cores and node.colocated_work != 1.0:
            notes.append(f"node {node.name}: compute costs x{node.colocated_work:.3f} its profiled CPU work "
                         f"(processes sharing {node.shared_cores} cores, measured co-located)")
    if options.slowdown:
        notes.append("slowdown factors applied: " + ", ".join(f"{g} x{f}" for g, f in sorted(options.slowdown.items())))
    if options.jitter_cv:
        notes.append(f"compute jitter: lognormal, cv {options.jitter_cv}, seed {options.seed}")
    return notes
