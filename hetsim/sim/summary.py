"""Turn a finished run's recordings into a Report (prediction); the sections a measurement shares
(window, throughput, staleness, sync) are built by hetsim.report_sections, as executor.measure's are."""

from __future__ import annotations

from dataclasses import asdict

from hetsim.cluster import Cluster
from hetsim.caveats import caveats
from hetsim.errors import NoSteadyStateError
from hetsim.memory import StageMemory
from hetsim.plan import Plan
from hetsim.profile import ModelProfile
from hetsim.report import GpuStats, LinkStats, Report
from hetsim.report_sections import RunRecords, plan_window, run_sections, window_notes
from hetsim.sim.pipeline import Stage
from hetsim.sim.recorder import Recorder
from hetsim.sim.world import World

__all__ = ["build_report"]


def build_report(world: World, rec: Recorder, plan: Plan, cluster: Cluster, profile: ModelProfile,
                 options, memory: dict[str, StageMemory], stages: list[list[Stage]], sync) -> Report:
    start, end = rec.start, rec.end
    window = plan_window(plan, rec.completion_times, rec.warmup)
    if start is None or end is None or end.t <= start.t or window is None:
        raise NoSteadyStateError(f"no steady-state window: no simulated time passed between the last virtual worker "
                              f"finishing its {options.warmup_waves} warm-up waves and the first finishing all "
                              f"{options.waves}; simulate more waves")
    span = end.t - start.t
    run = RunRecords(window=window, start_s=start.t, end_s=end.t,
                     vw_sync_wait_s=[end.vw_sync_wait[i] - start.vw_sync_wait[i]
                                     for i in range(len(plan.virtual_workers))],
                     staleness_local=rec.staleness_local, staleness_global=rec.staleness_global, gates=rec.gates,
                     in_flight=max(m.in_flight for m in memory.values()),
                     tokens_per_sample=profile.tokens_per_sample, **_sync_state(plan, sync))
    return Report(
        kind="prediction", plan=plan.to_dict(), cluster=cluster.name, model=profile.model,
        profile_source=profile.source, settings=_settings(options, world),
        gpus=_gpus(world, plan, memory, stages, start, end, span), links=_links(world, start, end, span),
        notes=(_notes(profile, options, cluster, plan) + _wsp_notes(rec, plan, window, options)
               + window_notes(plan, window)),
        **run_sections(plan, run))


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
                if any(o.id == g for o in out):
                    continue        # a later model chunk of a GPU already listed (interleaved schedules)
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


def _sync_state(plan: Plan, sync) -> dict:
    """The simulated sync's own state for the report: WSP's shards and final clocks, SDPipe's groups."""
    if plan.sync.mode == "wsp":
        return {"wsp_state": {"shards": [{"node": s.node, "layers": list(s.layers), "fraction": s.fraction}
                                         for s in sync.shards],
                              "final_clocks": list(sync.c_local)}}
    if plan.sync.mode == "sdpipe":
        return {"sdpipe_group_sizes": [len(g) for groups in sync.groups for g in groups],
                "sdpipe_connections": sync.connections}
    return {}


def _wsp_notes(rec: Recorder, plan: Plan, window, options) -> list[str]:
    """Say when WSP's steady rate differs from what the finite window measured, and whether the run
    was long enough for the staleness bound to bind."""
    if not window.locked or len(window.spans) < 2:
        return []
    free = [window.free_rate(v) for v in range(len(window.spans))]
    slowest = min(range(len(free)), key=free.__getitem__)
    lead = max(free) / free[slowest] - 1
    if lead < 0.005:
        return []
    names = [vw.name for vw in plan.virtual_workers]
    bound = plan.sync.staleness_bound
    text = (f"WSP steady rate: inside the window the other VWs ran up to {lead:.1%} faster than "
            f"{names[slowest]}; the bound D = {bound} holds every VW to the slowest one's pace in the long "
            f"run, so each is counted at {names[slowest]}'s rate "
            f"(the window's own total: {sum(free) * plan.minibatch_size:.1f} samples/s)")
    if not any(wait > 0 for _, _, _, wait, _ in rec.gates):
        text += (f"; the bound never bound in {options.waves} waves: the run is too short to reach WSP's "
                 f"steady state")
    return [text]


def _notes(profile: ModelProfile, options, cluster: Cluster, plan: Plan) -> list[str]:
    notes = [f"profile: {profile.source}"]
    for node in cluster.nodes:
        if node.shared_cores and node.colocated_work != 1.0:
            notes.append(f"node {node.name}: compute costs x{node.colocated_work:.3f} its profiled CPU work "
                         f"(processes sharing {node.shared_cores} cores, measured co-located)")
    if options.slowdown:
        notes.append("slowdown factors applied: " + ", ".join(f"{g} x{f}" for g, f in sorted(options.slowdown.items())))
    if options.jitter_cv:
        notes.append(f"compute jitter: lognormal, cv {options.jitter_cv}, seed {options.seed}")
    groups = {(cluster.gpu(s.gpu).type.name, s.tp) for vw in plan.virtual_workers for s in vw.stages}
    return notes + caveats(profile, cluster, groups, plan.precision, plan.gpus)
