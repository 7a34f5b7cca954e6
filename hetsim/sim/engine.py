"""Wire a plan into a SimPy model, run it, and turn what it recorded into a Report."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from hetsim.cluster import Cluster
from hetsim.errors import HetsimError, SimulationError
from hetsim.fields import is_real, is_whole
from hetsim.feasibility import check_plan, vw_schedule
from hetsim.parameter_servers import ps_shards
from hetsim.plan import Plan
from hetsim.profile import ModelProfile
from hetsim.schedule import schedule_kind, validate_schedule
from hetsim.schedule.registry import WEIGHT_GRAD_FRACTION
from hetsim.sim.allreduce import BulkSync
from hetsim.sim.pipeline import Stage, device_process
from hetsim.sim.recorder import Recorder
from hetsim.sim.sdpipe import SemiDecentralisedSync
from hetsim.sim.summary import build_report
from hetsim.sim.world import Device, World
from hetsim.sim.wsp import WaveSync
from hetsim.report import Report
from hetsim.report_sections import drain_minibatches
from hetsim.trace import TraceWriter
from hetsim.units import MAX_JITTER_CV

__all__ = ["SimOptions", "run_simulation", "check_length", "MAX_STAGE_MINIBATCHES"]


@dataclass(frozen=True, kw_only=True)
class SimOptions:
    """How long to simulate and what to perturb. Same options and seed give the same result."""

    waves: int = 20
    warmup_waves: int = 2
    seed: int = 0
    jitter_cv: float = 0.0                 # per-compute lognormal jitter, coefficient of variation
    slowdown: dict[str, float] = field(default_factory=dict)   # gpu id -> factor (2.0 = half speed)
    straggler_prob: float = 0.0            # SDPipe-style: chance a device sleeps before a forward
    straggler_delay_s: float = 0.0
    trace: bool = True

    def __post_init__(self):
        for name in ("waves", "warmup_waves", "seed"):
            value = getattr(self, name)
            if not is_whole(value) or value < 0:
                raise HetsimError(f"{name}: expected a whole number >= 0, got {value!r}")
        for name in ("jitter_cv", "straggler_prob", "straggler_delay_s"):
            if not is_real(getattr(self, name)):
                raise HetsimError(f"{name}: expected a number, got {getattr(self, name)!r}")
        if not isinstance(self.slowdown, dict) or not all(
                isinstance(g, str) and is_real(f) for g, f in self.slowdown.items()):
            raise HetsimError(f"slowdown: expected a mapping of GPU or node names to factors, got {self.slowdown!r}")
        if self.waves < 1:
            raise HetsimError(f"waves: must be >= 1, got {self.waves}")
        if not 0 <= self.warmup_waves < self.waves:
            raise HetsimError(f"warmup_waves: must be in [0, waves), got {self.warmup_waves} "
                              f"with waves={self.waves}")
        if not 0 <= self.jitter_cv <= MAX_JITTER_CV:
            raise HetsimError(f"jitter_cv: must be in [0, {MAX_JITTER_CV:g}], got {self.jitter_cv}")
        if not 0 <= self.straggler_prob <= 1:
            raise HetsimError(f"straggler_prob: must be in [0, 1], got {self.straggler_prob}")
        if not 0 <= self.straggler_delay_s < math.inf:
            raise HetsimError(f"straggler_delay_s: must be finite and >= 0, got {self.straggler_delay_s}")
        for gpu, factor in self.slowdown.items():
            if not 0 < factor < math.inf:
                raise HetsimError(f"slowdown[{gpu}]: must be finite and > 0, got {factor}")


# Stage-minibatches (waves x Nm x the stages of every virtual worker) a run may simulate: about a
# minute of simulation. Steady state comes within a few waves, so longer runs add time, not accuracy.
MAX_STAGE_MINIBATCHES = 500_000


def check_length(waves: int, nm: int, stages: int, name: str = "waves") -> None:
    """Refuse a run of `waves` waves of Nm minibatches through `stages` stages (over every virtual
    worker) too long to finish in reasonable time, naming the option that sets its length."""
    work = waves * nm * stages
    if work > MAX_STAGE_MINIBATCHES:
        raise SimulationError(f"{name}: {waves} waves x Nm={nm} x {stages} stages is {work:,} stage-minibatches "
                              f"to simulate, more than {MAX_STAGE_MINIBATCHES:,} (minutes of simulation); steady "
                              "state comes within a few waves, so simulate fewer")


def run_simulation(cluster: Cluster, profile: ModelProfile, plan: Plan,
                   options: SimOptions = SimOptions()) -> Report:
    """Simulate `options.waves` waves of every virtual worker; the Report carries the trace."""
    check_length(options.waves, plan.nm, _n_stages(plan))
    profile = profile.scaled_to_batch(plan.minibatch_size)
    for gpu in options.slowdown:
        cluster.gpu(gpu)
    memory = check_plan(plan, cluster, profile, options.slowdown)     # of the order the run follows
    trace = TraceWriter("prediction") if options.trace else None
    n_vw = len(plan.virtual_workers)
    n_mb = options.waves * plan.nm
    world = World(cluster)
    _add_devices(world, cluster, options)         # before the recorder: with no warm-up it snapshots them
    rec = Recorder(world, n_vw, n_mb, options.warmup_waves * plan.nm, trace, drain_minibatches(plan))
    if trace is not None:
        world.net.on_rates = rec.link_rates
    stages = _build_stages(world, plan, profile, rec)
    sync = _make_sync(world, rec, plan, cluster, profile, stages, options.waves)
    if trace is not None:
        for slot in cluster.gpus:                 # rows in cluster order, not plan order
            if slot.id in rec.rows:
                trace.row(*rec.rows[slot.id])
    validated: list = []
    schedules = [vw_schedule(plan, vw, cluster, profile, options.waves, world.topology, options.slowdown)
                 for vw in plan.virtual_workers]
    for vw_stages, schedule in zip(stages, schedules):
        if not any(schedule is v for v in validated):
            validate_schedule(schedule)
            validated.append(schedule)
        for d, actions in enumerate(schedule.stages):
            chunks = tuple(vw_stages[schedule.virtual_stage(d, c)] for c in range(schedule.chunks))
            world.env.process(device_process(world, rec, sync, chunks, actions))
    world.env.run()
    _check_finished(stages, schedules, plan)
    report = build_report(world, rec, plan, cluster, profile, options, memory, stages, sync)
    report.trace = trace
    return report


def _n_stages(plan: Plan) -> int:
    return sum(len(vw.stages) for vw in plan.virtual_workers)


def _add_devices(world: World, cluster: Cluster, options: SimOptions) -> None:
    for i, slot in enumerate(cluster.gpus):
        world.devices[slot.id] = Device(
            world, slot, slowdown=options.slowdown.get(slot.id, 1.0), jitter_cv=options.jitter_cv,
            straggler_prob=options.straggler_prob, straggler_delay_s=options.straggler_delay_s,
            rng=np.random.default_rng([options.seed, i]))


def _build_stages(world: World, plan: Plan, profile: ModelProfile, rec: Recorder) -> list[list[Stage]]:
    """A Stage per plan stage (virtual stage, under interleaved schedules), in plan order."""
    kind = schedule_kind(plan.schedule)
    wire, redo = plan.activation_scale, plan.recompute
    out = []
    for v, vw in enumerate(plan.virtual_workers):
        gpus = [s.gpu for s in vw.stages]
        row = []
        for s, spec in enumerate(vw.stages):
            slot = world.cluster.gpu(spec.gpu)
            lo, hi = spec.layers
            times = profile.stage_times_tp(slot.type.name, lo, hi, spec.tp, redo)
            row.append(Stage(vw=v, index=s, n_stages=len(gpus), gpu=spec.gpu,
                             device=world.devices[spec.gpu], layers=spec.layers, fwd_s=times.fwd_s,
                             bwd_s=times.bwd_s, out_bytes=int(profile.cut_bytes(hi) * wire),
                             in_bytes=int(profile.cut_bytes(lo) * wire),
                             param_bytes=profile.stage_param_bytes(lo, hi),
                             prev_gpu=gpus[s - 1] if s else None,
                             next_gpu=gpus[s + 1] if s + 1 < len(gpus) else None,
                             nm=plan.nm, asynchronous=kind.asynchronous,
                             members=spec.members,
                             member_devices=tuple(world.devices[g] for g in spec.members) if spec.tp > 1 else (),
                             tp_allreduce_bytes=0 if times.measured_tp
                             else int(profile.stage_tp_allreduce_bytes(lo, hi) * wire),
                             tp_allreduce_calls=profile.stage_tp_allreduce_calls(lo, hi),
                             tp_allreduce_bwd_bytes=0 if times.measured_tp
                             else int(profile.stage_tp_allreduce_bytes(lo, hi, True, redo) * wire),
                             tp_allreduce_bwd_calls=profile.stage_tp_allreduce_calls(lo, hi, True, redo),
                             update_s=times.update_s,
                             bwd_weight_s=((times.bwd_s - times.recompute_s) * WEIGHT_GRAD_FRACTION
                                           if kind.split_backward else 0.0),
                             blocking_p2p=plan.blocking_p2p,
                             rendezvous_p2p=kind.explicit_p2p and not plan.blocking_p2p,
                             first_device=spec.gpu == gpus[0]))
            for k, member in enumerate(spec.members):
                m = world.cluster.gpu(member)
                tp = f" tp{k}/{spec.tp}" if spec.tp > 1 else ""
                on_gpu = "+".join(f"s{j}" for j, other in enumerate(vw.stages) if other.gpu == spec.gpu)   # chunks
                rec.rows[member] = (m.node, f"{m.id.split('/')[1]} {m.type.display_name} [{vw.name} {on_gpu}{tp}]")
        out.append(row)
    return out


def _make_sync(world, rec, plan: Plan, cluster, profile, stages, waves: int):
    n_vw, mode = len(plan.virtual_workers), plan.sync.mode
    if mode == "wsp":
        return WaveSync(world, rec, profile, ps_shards(plan, cluster, profile),
                        [len(s) for s in stages], plan.sync.staleness_bound,
                        plan.sync.offset_for(plan.schedule))
    if mode == "bsp":
        return BulkSync(world, n_vw)
    if mode == "sdpipe":
        return SemiDecentralisedSync(world, n_vw, len(stages[0]), plan.sync, waves)
    return None


def _check_finished(stages: list[list[Stage]], schedules, plan: Plan) -> None:
    stuck = [f"{plan.virtual_workers[st.vw].name} stage {st.index} at {schedule.stages[st.index][st.position]}"
             for vw_stages, schedule in zip(stages, schedules) for st in vw_stages[:schedule.n_stages]
             if st.position < len(schedule.stages[st.index])]
    if stuck:
        raise SimulationError("simulation deadlocked: " + "; ".join(stuck))
