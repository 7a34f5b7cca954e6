"""The report sections a prediction and a measurement share, built by one function from what a run
recorded: window, throughput, per-VW rates, staleness and sync.

hetsim.sim.summary hands it the simulator's records and executor.measure the ranks' records, so both
reports are computed by the same code and compare field by field (hetsim.compare).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from hetsim.plan import ASYNC_SCHEDULES, Plan
from hetsim.report import VwStats, distribution
from hetsim.window import SteadyWindow, steady_window

__all__ = ["RunRecords", "plan_window", "window_notes", "drain_minibatches", "run_sections", "staleness_bounds"]


@dataclass(frozen=True, kw_only=True)
class RunRecords:
    """What a run (simulated or measured) recorded, as the shared sections need it."""
    window: SteadyWindow
    start_s: float                                # the span the per-GPU and per-link figures cover
    end_s: float
    vw_sync_wait_s: Sequence[float]               # per VW, inside that span
    staleness_local: list[tuple]                  # (vw, stage, minibatch, staleness)
    staleness_global: list[tuple]                 # WSP: (vw, stage, wave, pulled clock, staleness)
    gates: list[tuple]                            # WSP pulls: (vw, stage, wave, wait_s, global clock)
    in_flight: int                                # most minibatches in flight on one stage
    tokens_per_sample: int | None = None
    wsp_state: dict[str, Any] = field(default_factory=dict)   # WSP: where the servers' state lives
    sdpipe_group_sizes: Sequence[int] = ()
    sdpipe_connections: Any = None


def plan_window(plan: Plan, completions: list[list[float]], warmup: int) -> SteadyWindow | None:
    """The steady window of a run of `plan`, prediction or measurement: VWs timed over whole waves of
    Nm, under WSP each counted at the slowest one's rate, and a schedule that never flushes without its
    final drain (hetsim.window)."""
    return steady_window(completions, warmup, period=plan.nm, locked=plan.sync.mode == "wsp",
                         drain=drain_minibatches(plan))


def window_notes(plan: Plan, window: SteadyWindow) -> list[str]:
    """Say when some VW had no whole wave inside the window, or only waves that include the run's final
    drain, so that its rate is not a steady state's."""
    notes = []
    if window.whole_run:
        names = ", ".join(plan.virtual_workers[i].name for i in window.whole_run)
        notes.append(f"window: {window.duration:.3g} s, less than a whole wave of {names}, each timed instead over "
                     "its whole run after warm-up (pipeline fill included): not a steady-state rate; simulate more "
                     "waves")
    if window.drain_counted:
        names = ", ".join(plan.virtual_workers[i].name for i in window.drain_counted)
        notes.append(f"window: the final drain of {names} is counted (no wave to spare after warm-up), which runs "
                     f"faster than steady state: give at least warm-up + 2 waves")
    return notes


def drain_minibatches(plan: Plan) -> int:
    """The completions of a run's final drain that the window leaves out: the last wave of a schedule
    that never flushes (hetsim.window), none of a flush schedule's."""
    return plan.nm if plan.schedule in ASYNC_SCHEDULES else 0


def run_sections(plan: Plan, run: RunRecords) -> dict[str, Any]:
    """Report fields window, throughput, virtual_workers, staleness, sync, staleness_local/_global."""
    vws = [VwStats(name=vw.name, minibatches=run.window.minibatches(i), minibatches_per_s=run.window.rate(i),
                   samples_per_s=run.window.rate(i) * plan.minibatch_size, sync_wait_s=run.vw_sync_wait_s[i])
           for i, vw in enumerate(plan.virtual_workers)]
    return {"window": {"start_s": run.start_s, "end_s": run.end_s, "duration_s": run.end_s - run.start_s},
            "throughput": _throughput(plan, vws, run.tokens_per_sample), "virtual_workers": vws,
            "staleness": _staleness(plan, run), "sync": _sync(plan, run),
            "staleness_local": run.staleness_local, "staleness_global": run.staleness_global}


def _throughput(plan: Plan, vws: list[VwStats], tokens_per_sample: int | None) -> dict[str, float]:
    rate = sum(v.minibatches_per_s for v in vws)
    out = {"minibatches_per_s": rate, "samples_per_s": rate * plan.minibatch_size,
           # a wave of Nm minibatches per virtual worker: one optimizer step under flush schedules
           "iteration_s": plan.nm * len(vws) / rate}
    if tokens_per_sample:
        out["tokens_per_s"] = rate * plan.minibatch_size * tokens_per_sample
    return out


def staleness_bounds(plan: Plan, in_flight: int) -> tuple[int, int | None]:
    """(local, global) staleness bounds of a plan whose schedule holds at most `in_flight` minibatches
    on a stage: local <= in-flight - 1 under weight stashing (not Nm - 1: a pipeline whose round trip
    is shorter than Nm forwards never fills up), global <= D + pull_offset clocks under WSP (None
    otherwise). The planner's table and both reports state these same figures."""
    local = in_flight - 1 if plan.schedule in ASYNC_SCHEDULES else 0
    if plan.sync.mode != "wsp":
        return local, None
    return local, plan.sync.staleness_bound + plan.sync.offset_for(plan.schedule)


def _staleness(plan: Plan, run: RunRecords) -> dict[str, Any]:
    """Distributions over every minibatch (local) and every pushed update (global), with their bounds."""
    local, global_ = staleness_bounds(plan, run.in_flight)
    out = {"local": distribution(r[3] for r in run.staleness_local), "local_bound": local}
    if global_ is not None:
        out["global"] = distribution(r[4] for r in run.staleness_global)
        out["global_bound"] = global_
    return out


def _bound_waits(plan: Plan, gates: list[tuple]) -> dict[str, float]:
    """Seconds each VW's input stage waited on the bound (one pass: a 1,024-GPU run has many gates)."""
    waits = [0.0] * len(plan.virtual_workers)
    for vw, stage, _, wait_s, _ in gates:
        if stage == 0:
            waits[vw] += wait_s
    return {vw.name: waits[i] for i, vw in enumerate(plan.virtual_workers)}


def _sync(plan: Plan, run: RunRecords) -> dict[str, Any]:
    spec = plan.sync
    out: dict[str, Any] = {"mode": spec.mode}
    if spec.mode == "wsp":
        offset = spec.offset_for(plan.schedule)
        out.update(staleness_bound=spec.staleness_bound, pull_offset=offset, ps_placement=spec.ps_placement,
                   **run.wsp_state,
                   max_clock_gap=max(((w - offset) - c for _, _, w, _, c in run.gates), default=0),
                   bound_wait_s=_bound_waits(plan, run.gates))
    elif spec.mode == "sdpipe":
        out.update(period=spec.sdpipe_period, groups=len(run.sdpipe_group_sizes),
                   group_size=distribution(run.sdpipe_group_sizes), connections=run.sdpipe_connections)
    return out
