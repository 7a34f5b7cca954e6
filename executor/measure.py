"""Turn the ranks' records into a hetsim Report (kind "measurement") and a Chrome trace.

The ranks' records go to hetsim.report_sections, the builder hetsim.sim.summary hands the simulator's
records to, so a prediction and a measurement compare field by field: throughput and per-GPU times
over the window in which every VW is past warm-up and none has finished (hetsim.window).
"""

from __future__ import annotations

import statistics

from hetsim.report import GpuStats, Report
from hetsim.report_sections import RunRecords, plan_window, run_sections, window_notes
from hetsim.trace import TraceWriter

from executor.emulation import EMULATION_NOTE
from executor.health import ExecutorError
from executor.layout import RankLayout
from executor.optimizer import plan_optimizer
from executor.record import RankRecord

__all__ = ["build_measured_report"]


def build_measured_report(job, layout: RankLayout, records: list[RankRecord], schedules) -> Report:
    plan, opts = job.plan, job.options
    origin = min(r.wall0 for r in records)
    warm = opts.warmup_waves * plan.nm
    times = [[records[layout.stage_rank(v, 0)].wall(t) - origin for t in
              records[layout.stage_rank(v, 0)].completions] for v in range(len(plan.virtual_workers))]
    window = plan_window(plan, times, warm)
    if window is None:
        raise ExecutorError(f"no steady-state window: a virtual worker finished its {opts.waves} waves before "
                            f"another had finished its {opts.warmup_waves} warm-up waves; raise waves")
    start, end = window.start, window.end
    clipped = {r.rank: _clip(r, origin, start, end) for r in records}
    run = RunRecords(window=window, start_s=start, end_s=end,
                     vw_sync_wait_s=[clipped[layout.stage_rank(v, 0)]["sync"]
                                     for v in range(len(plan.virtual_workers))],
                     staleness_local=sorted(x for r in records for x in r.staleness_local),
                     staleness_global=sorted(x for r in records for x in r.staleness_global),
                     gates=[g for r in records for g in r.gates],
                     in_flight=max(schedules[r.vw].in_flight(r.stage) for r in layout.stage_ranks),
                     tokens_per_sample=records[layout.stage_rank(0, 0)].tokens_per_sample,
                     **_sync_state(plan, records, layout))
    report = Report(
        kind="measurement", plan=plan.to_dict(), cluster=job.cluster.name, model=job.model,
        profile_source=f"measured by the executor (torch.distributed, {records[0].backend})",
        settings=_settings(opts, plan, records[0].backend), gpus=_gpus(job, layout, records, clipped, end - start),
        links=[], notes=_notes(opts, plan.sync.mode) + window_notes(plan, window), training=_training(plan, layout, records, clipped, origin, start, end),
        losses=_loss_curve(records, origin), **run_sections(plan, run))
    if opts.trace:
        report.trace = _trace(job, layout, records, origin)
    return report


def _clip(rec: RankRecord, origin: float, start: float, end: float) -> dict[str, float]:
    out = {"compute": 0.0, "wait": 0.0, "sync": 0.0, "optimizer": 0.0, "tp": 0.0}
    for _, cat, t0, t1 in rec.spans:
        a, b = max(rec.wall(t0) - origin, start), min(rec.wall(t1) - origin, end)
        if b > a:
            out[cat] += b - a
            if cat == "optimizer":          # optimiser work is compute too (the rank is busy)
                out["compute"] += b - a
            elif cat == "tp":               # a TP all-reduce inside a forward's or backward's span is not
                out["compute"] -= b - a     # compute: the simulator runs it after the compute
    return out


def _settings(opts, plan, backend: str) -> dict:
    optimizer = plan_optimizer(plan)
    return {"waves": opts.waves, "warmup_waves": opts.warmup_waves, "seed": opts.seed, "data": opts.data,
            "optimizer": optimizer, "lr": opts.lr_for(optimizer),
            **({"momentum": opts.momentum} if optimizer == "momentum" else {}),
            "slowdown": dict(sorted(opts.slowdown.items())), "threads_per_rank": opts.threads, "backend": backend,
            "device": opts.device}


def _gpus(job, layout: RankLayout, records, clipped, span: float) -> list[GpuStats]:
    out = []
    for role in layout.stage_ranks:
        rec, c = records[role.rank], clipped[role.rank]
        slot = job.cluster.gpu(role.gpu)
        stash = (rec.stash_peak_versions - 1) * rec.weights_bytes
        out.append(GpuStats(
            id=role.gpu, type=slot.type.name, vw=job.plan.virtual_workers[role.vw].name, stage=role.stage,
            layers=role.layers, busy_fraction=c["compute"] / span, compute_s=c["compute"],
            recv_wait_s=c["wait"], sync_wait_s=c["sync"], memory_bytes=rec.peak_memory_bytes,
            memory_capacity_bytes=slot.type.memory_bytes,
            memory_breakdown={rec.memory_kind: rec.peak_memory_bytes, "weights_bytes": rec.weights_bytes,
                              "stashed_weights_bytes": stash}, tp=role.tp))
    return out


def _sync_state(plan, records, layout: RankLayout) -> dict:
    """The measured sync's own state for the report: WSP's server ranks, the SDPipe scheduler's groups."""
    if plan.sync.mode == "wsp":
        return {"wsp_state": {"parameter_server_ranks": len(layout.ps_ranks)}}
    if plan.sync.mode == "sdpipe":
        scheduler = records[layout.scheduler_rank]
        return {"sdpipe_group_sizes": [len(members) for _, _, members, _ in scheduler.groups],
                "sdpipe_connections": list(scheduler.connections)}
    return {}


def _notes(opts, sync_mode: str) -> list[str]:
    notes = ["measured: torch.distributed executor, one process per stage (per member of a tensor-parallel "
             "stage) and per parameter server"
             + (", and one for the sdpipe group scheduler" if sync_mode == "sdpipe" else "")]
    if any(f != 1.0 for f in opts.slowdown.values()):
        notes.append(EMULATION_NOTE + ": " + ", ".join(f"{g} x{f}" for g, f in sorted(opts.slowdown.items())))
    return notes


def _training(plan, layout: RankLayout, records, clipped, origin: float, start: float, end: float) -> dict:
    losses = sorted(x for r in records for x in r.losses)
    chunks = lambda role: plan.virtual_workers[role.vw].chunks
    work = {layout.roles[r.rank].gpu: _work_per_minibatch(r, origin, start, end, chunks(layout.roles[r.rank]))
            for r in records if layout.roles[r.rank].kind == "stage"}
    return {"losses": [list(x) for x in losses],
            "compute_work_s_per_minibatch": work,
            # How much one pass's work varies from the next on each rank: what hetsim's --jitter stands for.
            # (Not for a rank holding several chunks: its passes' names do not say which chunk's.)
            "compute_work_cv": {layout.roles[r.rank].gpu: _work_cv(r, origin, start, end)
                                for r in records if layout.roles[r.rank].kind == "stage"
                                and chunks(layout.roles[r.rank]) == 1},
            "optimizer_s": {layout.describe(r.rank): clipped[r.rank]["optimizer"] for r in records
                            if layout.roles[r.rank].kind == "stage"},
            # Seconds in a tensor-parallel stage's all-reduces inside its forwards and backwards.
            "tp_allreduce_s": {role.gpu: clipped[role.rank]["tp"] for role in layout.stage_ranks if role.tp > 1},
            "weight_versions": {layout.describe(r.rank): [list(v) for v in r.versions] for r in records
                                if r.versions},
            "final_weights": {layout.describe(r.rank): r.final_weights for r in records if r.final_weights},
            "devices": {layout.describe(r.rank): r.device for r in records},
            **_sdpipe_groups(records),
            "emulation": EMULATION_NOTE}


def _loss_curve(records, origin: float) -> list[tuple[int, int, float, float]]:
    """(vw, minibatch, t_s, loss) of every loss, in time order: t_s is seconds since the run's common
    start (the window's time axis), so time to a target loss reads off directly."""
    curve = [(vw, mb, r.wall(t) - origin, loss) for r in records
             for (vw, mb, loss), t in zip(r.losses, r.loss_times)]
    return sorted(curve, key=lambda x: (x[2], x[0], x[1]))


def _kind(name: str) -> str:
    """The kind of a recorded action: its name without the minibatch or wave number ("B12" -> "B")."""
    return name.rstrip("0123456789")


def _window_work(rec: RankRecord, origin: float, start: float, end: float) -> dict[str, list[float]]:
    """Each kind of action's seconds of work, one entry per action that ended inside the window."""
    kinds: dict[str, list[float]] = {}
    for t, name, seconds in rec.work:
        if start < rec.wall(t) - origin <= end:
            kinds.setdefault(_kind(name), []).append(seconds)
    return kinds


def _work_per_minibatch(rec: RankRecord, origin: float, start: float, end: float, chunks: int = 1) -> float:
    """Seconds of one minibatch's forward, backward and optimiser work on a rank (thread CPU seconds
    on CPU, GPU seconds on CUDA; emulation's spin excluded), over all `chunks` model chunks it holds:
    per kind of action, its mean in the window times how often it comes per minibatch in the whole
    run (so an optimiser step per wave counts 1/Nm; a rank of an interleaved schedule runs a backward
    per chunk and minibatch). Summing the window's CPU instead and dividing by the rate miscounts by
    up to a minibatch's work at each edge of the window."""
    counts: dict[str, int] = {}
    for _t, name, _seconds in rec.work:
        counts[_kind(name)] = counts.get(_kind(name), 0) + 1
    # One backward per minibatch: "B", or "I" where ZB-H1 splits it into input (I) and weight (W) halves.
    minibatches = (counts.get("B", 0) + counts.get("I", 0)) / chunks or 1
    per_minibatch = {kind: n / minibatches for kind, n in counts.items()}
    return sum(sum(v) / len(v) * per_minibatch[kind] for kind, v in _window_work(rec, origin, start, end).items())


def _work_cv(rec: RankRecord, origin: float, start: float, end: float) -> float:
    """The coefficient of variation of one pass's work on a rank in the window, per kind of action
    (forward, backward, step...), averaged with each kind's share of the work as weight: what the
    simulator's lognormal jitter, drawn for each compute of a rank, stands for."""
    spread = [(sum(v), statistics.stdev(v) / statistics.fmean(v))
              for v in _window_work(rec, origin, start, end).values() if len(v) >= 3 and statistics.fmean(v) > 0]
    total = sum(w for w, _ in spread)
    return sum(w * cv for w, cv in spread) / total if total else 0.0


def _sdpipe_groups(records) -> dict:
    """Every group the SDPipe scheduler formed, per stage index, in order: [members, their waves]."""
    groups = [g for r in records for g in r.groups]
    if not groups:
        return {}
    by_stage: dict[str, list] = {}
    for stage, _number, members, waves in groups:
        by_stage.setdefault(f"stage {stage}", []).append([list(members), list(waves)])
    return {"sdpipe_groups": by_stage}


def _trace(job, layout: RankLayout, records, origin: float) -> TraceWriter:
    trace = TraceWriter("measurement")
    rows = {}
    for role in layout.stage_ranks:           # the simulator's row names: "gpuN TYPE [vw sS tpK/T]"
        slot = job.cluster.gpu(role.gpu)
        tp = f" tp{role.tp_rank}/{role.tp}" if role.tp > 1 else ""
        rows[role.rank] = (slot.node, f"{slot.id.split('/')[1]} {slot.type.display_name} "
                                      f"[{job.plan.virtual_workers[role.vw].name} s{role.stage}{tp}]")
    order = {g.id: i for i, g in enumerate(job.cluster.gpus)}
    for rank in sorted(rows, key=lambda r: order[layout.roles[r].gpu]):
        trace.row(*rows[rank])
    for role in layout.stage_ranks:
        rec = records[role.rank]
        for name, cat, t0, t1 in rec.spans:
            trace.span(*rows[role.rank], name, rec.wall(t0) - origin, t1 - t0, cat=cat,
                       args={"gpu": role.gpu, "rank": role.rank})
    return trace
