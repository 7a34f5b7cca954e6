"""Set up one rank from the job description (the same on every rank) and run its role."""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from datetime import timedelta
from types import SimpleNamespace

import torch
import torch.distributed as dist

import modelzoo
from modelzoo.allocator import steady_allocator
from modelzoo.profiler import math_mode
from modelzoo.tasks import Task, task_of
from modelzoo.tp import TPComm, split_stage, stage_loss, unsplittable
from executor.checkpoint import last_common_wave, load_stage, save_stage
from executor.data import SyntheticData
from executor.emulation import Emulation
from executor.layout import RankLayout, rank_layout, shard_indices
from executor.optimizer import plan_optimizer
from executor.options import ExecOptions
from executor.placement import CPU, Placement, gpu_count, placement_for, uses_nccl
from executor.record import RankRecord
from executor.runner import Chunk, StageRank
from executor.sdpipe import GroupScheduler, GroupSyncClient
from executor.stage import StageModel
from executor.wsp import ParameterServer, Span, WspClient
from hetsim.cluster import Cluster
from hetsim.errors import PlanError
from hetsim.feasibility import vw_schedule
from hetsim.parameter_servers import ps_shards
from hetsim.plan import ASYNC_SCHEDULES, Plan
from hetsim.profile import ModelProfile
from hetsim.schedule import Action, Schedule, schedule_kind

__all__ = ["Job", "run_rank", "job_layout", "layer_values", "check_tp_layers"]


def _saver(directory: str, rank: int, r: StageRank):
    def save(wave: int) -> None:
        save_stage(directory, rank, wave, {"weights": r.model.weights, "optimizer": r.model.rule.state_dict(),
                                           "version": r.model.version, "applied": r.applied})
    return save


def _restore(runner: StageRank, state: dict) -> None:
    runner.model.weights = state["weights"]
    if "optimizer" not in state:      # written before other optimizers: SGD with momentum's buffers
        state["optimizer"] = {"optimizer": "momentum", "steps": 0,
                              "state": [None if b is None else (b,) for b in state["momentum"]]}
    runner.model.rule.load_state_dict(state["optimizer"])
    runner.model.version = state["version"]
    runner.model._mark()
    runner.applied = state["applied"]


@dataclass(frozen=True, kw_only=True)
class Job:
    plan: Plan
    cluster: Cluster
    model: str
    options: ExecOptions
    profile: ModelProfile | None = None     # shapes the hetpipe order (the plan's nominal costs)
    model_kwargs: tuple[tuple[str, object], ...] = ()   # constructor arguments, e.g. (("hidden", 1024),)

    def schedules(self) -> list[Schedule]:
        if schedule_kind(self.plan.schedule).needs_costs and self.profile is None:
            raise PlanError(f"profile: the {self.plan.schedule} schedule is ordered by the profile's costs; "
                            "pass --profile")
        profile = self.profile.scaled_to_batch(self.plan.minibatch_size) if self.profile else None
        # Ordered by the emulated devices' costs, as the simulator orders the run it predicts.
        return [vw_schedule(self.plan, vw, self.cluster, profile, self.options.waves,
                            slowdown=self.options.slowdown) for vw in self.plan.virtual_workers]


def _shards(job: Job, n_layers: int) -> list:
    # ps_shards reads only the layer count from the profile.
    return ps_shards(job.plan, job.cluster, SimpleNamespace(n_layers=n_layers))


def job_layout(job: Job, n_layers: int) -> RankLayout:
    return rank_layout(job.plan, len(_shards(job, n_layers)) if job.plan.sync.mode == "wsp" else 0)


def _check_supported(job: Job) -> None:
    if job.options.checkpoint_dir and (job.plan.schedule in ASYNC_SCHEDULES
                                       or any(vw.chunks > 1 for vw in job.plan.virtual_workers)
                                       or job.plan.sync.mode not in ("none", "bsp")):
        raise PlanError("checkpoint_dir: checkpoints need a flush schedule (gpipe, 1f1b-flush) with sync none or "
                        f"bsp (a consistent cut after each wave); plan {job.plan.name} uses "
                        f"{job.plan.schedule} with sync {job.plan.sync.mode}")
    _check_tp(job.plan)
    device = job.options.device
    if device != "cpu" and gpu_count() == 0:
        raise PlanError(f"device {device!r}: torch {torch.__version__} sees no CUDA device here; use cpu")
    if device.startswith("cuda:") and int(device[5:]) >= gpu_count():
        raise PlanError(f"device {device!r}: this host has {gpu_count()} CUDA device(s)")
    n_stages = len(set(job.plan.gpus))                             # a rank per tensor-parallel member
    if schedule_kind(job.plan.schedule).virtual_stages and uses_nccl(device, job.options.backend, n_stages):
        # NCCL matches a link's messages by order, not tag, and two chunks' messages share each link.
        raise PlanError(f"schedule {job.plan.schedule} runs over gloo only (its chunks share each "
                        "link, told apart by tag, which NCCL ignores); pass --backend gloo")
    one_gpu = device.startswith("cuda:") and n_stages > 1          # every rank on the GPU named
    if job.options.backend == "nccl" and (n_stages > gpu_count() or one_gpu):
        raise PlanError(f"backend: nccl needs a GPU per stage rank (NCCL refuses two ranks on one "
                        f"GPU); plan {job.plan.name} has {n_stages} stage ranks and this host {gpu_count()} GPU(s)")


def _check_tp(plan: Plan) -> None:
    """Tensor-parallel stages run under sync none or bsp, with one degree per stage index under bsp
    (member k of each replica averages its shard with member k of the others)."""
    tp = [[s.tp for s in vw.stages] for vw in plan.virtual_workers]
    if plan.sync.mode in ("wsp", "sdpipe") and any(t > 1 for row in tp for t in row):
        raise PlanError(f"plan {plan.name}: sync {plan.sync.mode} with tensor-parallel stages is not "
                        "supported yet (its parameter servers and group averages exchange whole stages); use sync "
                        "bsp or none")
    if plan.sync.mode == "bsp" and any(row != tp[0] for row in tp):
        raise PlanError(f"plan {plan.name}: sync bsp averages member k of a stage with member k of "
                        f"every replica, so each stage index needs the same tensor-parallel degree in every "
                        f"virtual worker; the degrees are {tp}")


def check_tp_layers(job: Job, graph) -> None:
    """Every tensor-parallel stage's layers can be split (modelzoo.tp.unsplittable)."""
    for vw in job.plan.virtual_workers:
        for s, spec in enumerate(vw.stages):
            reason = spec.tp > 1 and unsplittable(graph, *spec.layers, spec.tp)
            if reason:
                raise PlanError(f"plan {job.plan.name}: {vw.name} stage {s} on {list(spec.members)}: "
                                f"{reason}; give the stage one GPU")


def _model(job: Job):
    torch.manual_seed(job.options.seed)
    model, example = modelzoo.build(job.model, batch=1, **dict(job.model_kwargs))
    graph = modelzoo.layer_graph(model)
    return graph, layer_values(graph, example), task_of(model, example)


def layer_values(graph, example: torch.Tensor) -> dict:
    """Every layer's output for `example` (and the input under MODEL_INPUT): the shapes that cross cuts.
    Run in eval mode: a batch norm over one sample's 1x1 map (resnet18 at 32 px) cannot train, and
    the running statistics stay as built."""
    values = {modelzoo.MODEL_INPUT: example}
    training = graph.layers.training
    graph.layers.eval()
    try:
        with torch.no_grad():
            for i in range(len(graph)):
                values[i] = graph.layers[i](*(values[p] for p in graph.preds[i]))
    finally:
        graph.layers.train(training)
    return values


def run_rank(rank: int, job: Job, record: RankRecord) -> RankRecord:
    """Everything one rank does between process-group start and the gather of records, its matrix
    products in the plan's math (TF32 on CUDA for tf32, off for fp32), as the profiler measures them."""
    _check_supported(job)
    with math_mode(job.plan.precision):
        return _run_rank(rank, job, record)


def _run_rank(rank: int, job: Job, record: RankRecord) -> RankRecord:
    steady_allocator()                  # as the profiler does, so both time the same work
    torch.set_num_threads(job.options.threads)
    graph, values, task = _model(job)
    layout = job_layout(job, len(graph))
    numel = [sum(p.numel() for p in graph.layers[i].parameters()) for i in range(len(graph))]
    shards = [(s.layers, s.fraction) for s in _shards(job, len(graph))]
    role = layout.roles[rank]
    nccl = uses_nccl(job.options.device, job.options.backend, len(layout.stage_ranks))
    placement = placement_for(job.options.device, rank, nccl) if role.kind == "stage" else CPU
    record.device = placement.describe()
    record.backend = "gloo + nccl between stages" if nccl else "gloo"
    resume = _resume_wave(job, layout)      # read before the barrier: nobody has saved a newer one yet
    record.waiting_on = [r.rank for r in layout.roles if r.rank != rank]
    dist.barrier()
    record.perf0, record.wall0 = time.perf_counter(), time.time()
    tp_groups = _tp_groups(layout, nccl, job.options.timeout_s)
    groups = _bsp_groups(job, layout, nccl)
    p2p = _p2p_groups(job, layout) if nccl else {}
    if nccl:
        _connect(rank, [*tp_groups.values(), *groups.values()], p2p, placement)
    if role.kind == "ps":
        _serve(job, layout, graph, numel, shards, role.ps_index)
    elif role.kind == "scheduler":
        GroupScheduler(n_vw=len(job.plan.virtual_workers), n_stages=len(job.plan.virtual_workers[0].stages),
                       spec=job.plan.sync, waves=job.options.waves, stage_rank=layout.stage_rank,
                       record=record).serve()
    else:
        _stage(job, layout, role, graph, task, values, numel, shards, record, groups, resume, placement, p2p,
               tp_groups.get((role.vw, role.stage), (None, []))[0])
    record.finish(placement.peak_memory_bytes() if placement.cuda else None)
    return record


def _resume_wave(job: Job, layout: RankLayout) -> int | None:
    opts = job.options
    if not opts.resume:
        return None
    wave = last_common_wave(opts.checkpoint_dir, [r.rank for r in layout.stage_ranks])
    if wave is not None and wave + 1 + opts.warmup_waves >= opts.waves:
        raise PlanError(f"resume: checkpoints reach wave {wave}; with {opts.waves} waves and "
                        f"{opts.warmup_waves} warm-up there is nothing left to measure")
    return wave


def _bsp_groups(job: Job, layout: RankLayout, nccl: bool) -> dict[tuple[int, int], tuple[object, list[int]]]:
    """(process group, its ranks) per stage index and tensor-parallel member index across VWs, keyed
    (stage, member): member k of every replica reduces its shard in its own ring, as
    hetsim.sim.collectives.parallel_rings. Every rank must create them, in order."""
    if job.plan.sync.mode != "bsp":
        return {}
    timeout = timedelta(seconds=job.options.timeout_s) if nccl else None
    out = {}
    for s, spec in enumerate(job.plan.virtual_workers[0].stages):
        for k in range(spec.tp):
            ranks = [layout.member_ranks(v, s)[k] for v in range(len(job.plan.virtual_workers))]
            out[(s, k)] = (dist.new_group(ranks, backend="nccl" if nccl else None, timeout=timeout), ranks)
    return out


def _tp_groups(layout: RankLayout, nccl: bool, timeout_s: float) -> dict[tuple[int, int], tuple[object, list[int]]]:
    """(process group, its ranks) of every tensor-parallel stage, keyed (vw, stage). Every rank must
    create them, in order."""
    out = {}
    for lead in [r for r in layout.stage_ranks if r.tp > 1 and r.tp_rank == 0]:
        ranks = layout.member_ranks(lead.vw, lead.stage)
        out[(lead.vw, lead.stage)] = (dist.new_group(ranks, backend="nccl" if nccl else None,
                                                     timeout=timedelta(seconds=timeout_s)), ranks)
    return out


def _p2p_groups(job: Job, layout: RankLayout) -> dict[tuple[int, int], object]:
    """NCCL: a communicator per direction of each pipeline link, keyed (src, dst). NCCL runs a pair's
    operations in the order they were posted, so with one communicator for both directions a receive
    posted ahead for a gradient would hold up the activation sent the other way until the gradient
    came, which needs that activation first. Every rank must create them, in the same order."""
    groups, timeout = {}, timedelta(seconds=job.options.timeout_s)
    for v, vw in enumerate(job.plan.virtual_workers):
        for s in range(len(vw.stages) - 1):
            a, b = layout.stage_rank(v, s), layout.stage_rank(v, s + 1)
            groups[(a, b)] = dist.new_group([a, b], backend="nccl", timeout=timeout)
            groups[(b, a)] = dist.new_group([a, b], backend="nccl", timeout=timeout)
    return groups


def _connect(rank: int, collectives: list[tuple[object, list[int]]], p2p: dict, placement: Placement) -> None:
    """Set up every NCCL communicator now, in creation order. NCCL sets one up at its first operation
    and blocks until both ends arrive; left to the schedule, stage 0 would first post a receive on
    the gradient link and stage 1 one on the activation link, each waiting for the other forever."""
    if not placement.cuda:
        return                                   # parameter servers, the scheduler: in no NCCL group
    one = torch.zeros(1, device=placement.compute)
    for group, ranks in collectives:
        if rank in ranks:
            dist.all_reduce(one, group=group)
    for (src, dst), group in p2p.items():
        if rank == src:
            dist.send(one, dst, group=group)
        elif rank == dst:
            dist.recv(one, src, group=group)
    placement.synchronize()


def _serve(job: Job, layout: RankLayout, graph, numel, shards, j: int) -> None:
    """A parameter-server rank (it waits on every stage rank)."""
    flat = torch.cat([p.detach().reshape(-1) for p in graph.layers.parameters()])
    offsets = [0]
    for n in numel:
        offsets.append(offsets[-1] + n)
    index = {}
    for r in layout.stage_ranks:
        lo, hi = r.layers
        index[(r.vw, r.stage)] = (r.rank, Span(shard_indices(numel, shards, j, lo, hi), offsets[lo]))
    n_stages = [len(vw.stages) for vw in job.plan.virtual_workers]
    ParameterServer(global_flat=flat, stage_index=index, n_stages=n_stages, waves=job.options.waves,
                    staleness_bound=job.plan.sync.staleness_bound,
                    pull_offset=job.plan.sync.offset_for(job.plan.schedule)).serve()


def _bsp_peers(plan: Plan, layout: RankLayout, stage: int, member: int) -> list[int]:
    """Member `member` of stage `stage` in every VW: only BSP all-reduces across VWs (and requires
    equal stages); under WSP the VWs may have different numbers of stages."""
    if plan.sync.mode != "bsp":
        return []
    return [layout.member_ranks(v, stage)[member] for v in range(len(plan.virtual_workers))]


def _group_sync_client(plan: Plan, layout: RankLayout, role, n_stages: int, record) -> GroupSyncClient | None:
    if plan.sync.mode != "sdpipe":
        return None
    return GroupSyncClient(vw=role.vw, stage=role.stage, n_stages=n_stages, scheduler_rank=layout.scheduler_rank,
                           peers=[layout.stage_rank(v, role.stage) for v in range(len(plan.virtual_workers))],
                           record=record)


def _stage(job: Job, layout, role, graph, task: Task, values, numel, shards, record, groups, resume,
           placement: Placement, p2p: dict, tp_group) -> None:
    plan, opts = job.plan, job.options
    vw, s = role.vw, role.stage
    n_stages = len(plan.virtual_workers[vw].stages)
    lo, hi = role.layers
    batch = plan.minibatch_size
    data = SyntheticData(task=task, mode=opts.data, seed=opts.seed, batch=batch)
    record.tokens_per_sample = task.tokens_per_sample
    tp = None
    if role.tp > 1:                          # this member's share of the layers (modelzoo.tp)
        tp = TPComm(role.tp_rank, role.tp, tp_group, placement.wire)
        split_stage(graph, lo, hi, tp)
    chunks = _chunks(job, layout, role, graph, values, groups, placement)
    model = chunks[0].model
    wsp = None
    if plan.sync.mode == "wsp":
        ps = [r.rank for r in layout.ps_ranks]
        wsp = WspClient(vw=vw, stage=s, ps_ranks=ps,
                        shard_ranges=[shard_indices(numel, shards, j, lo, hi) for j in range(len(ps))],
                        device=placement.compute)
    kind = schedule_kind(plan.schedule)
    runner = StageRank(
        vw=vw, n_stages=n_stages, nm=plan.nm, asynchronous=kind.asynchronous, rendezvous=kind.explicit_p2p,
        chunks=chunks, data=data,
        emulation=Emulation(opts.slowdown.get(role.gpu, 1.0), placement), record=record, wsp=wsp,
        n_vw=len(plan.virtual_workers), fault=opts.fault_spec, rank=role.rank,
        sdpipe=_group_sync_client(plan, layout, role, n_stages, record),
        placement=placement, p2p_groups=p2p, tp=tp, tp_ranks=layout.member_ranks(vw, s))
    if opts.checkpoint_dir:
        runner.checkpoint = _saver(opts.checkpoint_dir, role.rank, runner)
    actions = job.schedules()[vw].stages[s]
    start = 0
    if resume is not None:
        _restore(runner, load_stage(opts.checkpoint_dir, role.rank, resume, placement.compute))
        start = actions.index(Action("STEP", resume)) + 1
    runner.run(actions, start)
    record.versions = model.versions
    record.weights_bytes = sum(c.model.numel for c in chunks) * 4
    record.stash_peak_versions = model.peak_versions
    flat = torch.cat([c.model.flat().cpu() for c in chunks])
    record.final_weights = hashlib.sha256(flat.numpy().tobytes()).hexdigest()[:16]


def _chunks(job: Job, layout: RankLayout, role, graph, values, groups, placement: Placement) -> list[Chunk]:
    """The model chunks this rank runs: its stage, or under virtual stages every stage j with
    j mod p = its device (each built from a fresh copy of the model, same seed, as a StageModel
    keeps only its own layers of the graph it is given)."""
    plan, opts = job.plan, job.options
    spec = plan.virtual_workers[role.vw]
    kind = schedule_kind(plan.schedule)
    batch, n_stages = plan.minibatch_size, len(spec.stages)
    optimizer = plan_optimizer(plan)
    shapes = lambda cut: [(batch, *values[k].shape[1:]) for k in graph.crossing(cut)]
    out = []
    for c, s in enumerate(range(role.stage, n_stages, spec.n_devices)):
        g = graph if c == 0 else _model(job)[0]
        lo, hi = spec.stages[s].layers
        model = StageModel(g, lo, hi, is_last=s == n_stages - 1, lr=opts.lr_for(optimizer), momentum=opts.momentum,
                           device=placement.compute, loss_fn=stage_loss(g, hi), optimizer=optimizer)
        model.split_backward = kind.split_backward
        model.track_deltas = plan.sync.mode == "wsp"
        model.flat_grads = plan.sync.mode == "bsp"
        model.sum_in_backward = not kind.asynchronous
        out.append(Chunk(stage=s, model=model, in_shapes=shapes(lo), out_shapes=shapes(hi),
                         prev_rank=layout.stage_rank(role.vw, s - 1) if s > 0 else None,
                         next_rank=layout.stage_rank(role.vw, s + 1) if s + 1 < n_stages else None,
                         group=groups.get((s, role.tp_rank), (None, []))[0],
                         group_ranks=_bsp_peers(plan, layout, s, role.tp_rank)))
    return out
