"""`hetsim validate`'s work (hetsim.cli.validate holds its arguments): profile this machine, predict
a plan with that profile, run it for real with the executor, and print predicted vs measured
throughput, per-stage times and staleness.

This host is described as one node whose devices are ranks sharing its cores (`shared_cores`); the
plan's GPUs are mapped onto those rank slots in plan order (a tensor-parallel stage's members too: the
node holds every group). hetsim reaches this module by name (hetsim.cli.torch_side).
With `--device cuda` the ranks compute on this host's GPUs (executor.placement): a GPU per stage rank
when there are enough, else round-robin over them (all on the one GPU `cuda:N` names), whose measured
concurrency (executor.colocation.gpu_concurrency) is then the node's `shared_cores`; the profile is
timed on the GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import re
import statistics
import time
from dataclasses import replace
from pathlib import Path

from executor.host import available_cores, host_memory_bytes, usable_cores
from executor.optimizer import plan_optimizer
from hetsim.cli.validate import WARMUP_WAVES, WAVES
from hetsim.cluster import Cluster, GpuSlot, LinkSpec, Node
from hetsim.errors import HetsimError, PlanError
from hetsim.gpu import GpuType
from hetsim.plan import Plan, StageSpec, VirtualWorker
from hetsim.profile import ModelProfile
from hetsim.report import Report
from hetsim.schedule.registry import schedule_kind
from hetsim.units import GIB

__all__ = ["run", "host_cluster", "cpu_type", "fits_host", "shared_memories", "onto_host", "with_optimizer_costs", "validate_plan", "write_inputs", "available_cores",
           "cpu_time_profile", "load_changed", "default_warmup", "bracketed", "with_counted_bytes",
           "work_rows", "work_drift", "compared_work", "measured_work_slowdown", "measured_work_cv", "WORK_DRIFT_PCT",
           "WAVES", "WARMUP_WAVES"]


def default_warmup(waves: int) -> int:
    """WARMUP_WAVES, or 2/5 of a shorter run (so that `--waves 10` alone still has a window)."""
    return min(WARMUP_WAVES, 2 * waves // 5)


LOAD_TOLERANCE = 0.2                  # cores; beyond this the host's load changed during a run
# Percent; the suite's max throughput error target. A rank whose measured CPU work differs from the
# profile's by more than this makes the prediction's inputs, not the simulator, the error's cause
# (one WSP run's profile read 18-27% above the work its ranks did, unflagged).
WORK_DRIFT_PCT = 8.0
# Jitter draws whose mean is the what-if at the run's own pass-to-pass variability (work_cv).
JITTER_SEEDS = 5


@functools.lru_cache(maxsize=1)
def cpu_type() -> GpuType:
    """A CPU rank as a device: its memory is the host's (executor.host.host_memory_bytes), which the
    ranks share (fits_host checks them together); its rates are unused, as runs are predicted from
    measured profiles."""
    return GpuType(name="cpu", display_name="CPU rank", memory_bytes=host_memory_bytes(), memory_bandwidth_Bps=1e10,
                   peak_fp32_flops=5e10, peak_fp16_flops=5e10,
                   sources=("placeholder: executor runs use measured profiles, not datasheet rates",))


def host_cluster(n_ranks: int, cores: float | None, link_Bps: float, latency_s: float,
                 colocated_work: float = 1.0, device_type: GpuType | None = None,
                 copy_cores: int | None = None, collective_latency_s: float = 0.0) -> Cluster:
    """This machine: one node with `n_ranks` CPU rank slots host/gpu0.. sharing `cores` cores, linked
    by gloo over loopback with the given bandwidth and per-message latency; compute costs
    `colocated_work` times its profiled CPU work there (see executor.colocation). On CUDA the slots
    are of `device_type` and `cores` is how many ranks the shared GPU runs at once (None: a GPU each),
    while `copy_cores` host cores move their messages (hetsim.cluster.Node.copy_cores). A collective
    call among the ranks costs `collective_latency_s` on top of its ring's messages."""
    device_type = device_type or cpu_type()
    slots = tuple(GpuSlot(id=f"host/gpu{i}", node="host", index=i, type=device_type) for i in range(n_ranks))
    link = LinkSpec(kind="loopback", bandwidth_Bps=link_Bps, latency_s=latency_s,
                    collective_latency_s=collective_latency_s)
    name = (f"this_host_{cores if cores is not None else 'dedicated'}_cores_{latency_s * 1e6:.0f}us_work_x{colocated_work:.3f}"
            + (f"_copies_on_{copy_cores}_cores" if copy_cores and cores is not None else ""))
    return Cluster(name=name, nodes=(Node(name="host", gpus=slots, intra_link=link, shared_cores=cores,
                                          colocated_work=colocated_work,
                                          copy_cores=copy_cores if cores is not None else None),),
                   network=link, ps_nodes=("host",), description="this host; devices are executor ranks")


def onto_host(plan: Plan) -> tuple[Plan, dict[str, str]]:
    """The plan with its GPUs renamed host/gpu0.. in plan order, and the renaming."""
    names = {g: f"host/gpu{i}" for i, g in enumerate(dict.fromkeys(plan.gpus))}
    vws = tuple(VirtualWorker(name=vw.name, stages=tuple(
        StageSpec(gpu=names[s.gpu], tp_gpus=tuple(names[g] for g in s.tp_gpus), layers=s.layers)
        for s in vw.stages)) for vw in plan.virtual_workers)
    return replace(plan, virtual_workers=vws), names


def with_optimizer_costs(profile: ModelProfile, per_layer_s: list[float], device_type: str = "cpu") -> ModelProfile:
    """Fold the optimiser's per-minibatch work into each layer's backward (the simulator's UPDATE and
    STEP take no time; in the executor they follow the backward on the same rank)."""
    layers = tuple(replace(l, bwd_s={**l.bwd_s, device_type: l.bwd_s[device_type] + extra})
                   for l, extra in zip(profile.layers, per_layer_s))
    return replace(profile, layers=layers, source=profile.source + " + measured optimiser work in bwd_s")


def with_counted_bytes(profile: ModelProfile, model: str, model_kwargs: dict) -> ModelProfile:
    """The profile with what a measured profile lacks, counted on the meta device at the profile's
    batch (modelzoo.counting.with_counts, as `hetsim profile` adds them): each layer's saved bytes
    (the last layer's with its loss's), for the memory prediction, and its tensor-parallel all-reduce
    bytes and calls of a forward and of a backward: the simulator runs a TP stage's compute divided by
    its degree, then these all-reduces on the node's links."""
    from modelzoo.counting import with_counts
    return with_counts(profile, _counts(model, profile.batch_size, model_kwargs))


def _counts(model: str, batch: int, model_kwargs: dict) -> ModelProfile:
    """modelzoo.counting's counted profile of the model, once per model, batch and arguments: validate
    needs it for the collective probe and for the profiles on both sides of the run."""
    return _counted(model, batch, tuple(sorted(model_kwargs.items())))


@functools.lru_cache(maxsize=8)
def _counted(model: str, batch: int, model_kwargs: tuple) -> ModelProfile:
    from modelzoo.counting import counted_profile
    return counted_profile(model, batch, **dict(model_kwargs))[0]


def with_collective_latency(cluster: Cluster, plan: Plan, model: str, model_kwargs: dict, device: str,
                            nccl: bool = False) -> tuple[Cluster, float]:
    """The host cluster with its link's collective latency measured now for the plan's tensor-parallel
    all-reduces (executor.calibrate.collective_call at the plan's bytes per call and widest group,
    on CPU with the plan's other ranks computing meanwhile), and the measured seconds of one call.
    One figure for the link: a plan mixing TP degrees has its narrower groups priced at the widest's."""
    from executor.calibrate import collective_call, collective_latency
    counts = _counts(model, plan.minibatch_size, model_kwargs).layers
    calls = sum(c.tp_calls + c.tp_bwd_calls for c in counts)
    nbytes = sum(c.tp_allreduce_bytes + c.tp_bwd_bytes for c in counts) // max(calls, 1)
    ranks = max(s.tp for vw in plan.virtual_workers for s in vw.stages)
    if not nbytes or ranks < 2:
        return cluster, 0.0
    others = len(plan.gpus) - ranks if device == "cpu" else 0
    per_call = collective_call(nbytes, ranks, device=device, nccl=nccl, spinners=others)
    node = cluster.nodes[0]
    link = node.intra_link
    fixed = collective_latency(per_call, nbytes, ranks, link.latency_s, link.bandwidth_Bps)
    node = replace(node, intra_link=replace(link, collective_latency_s=fixed))
    return replace(cluster, nodes=(node,), network=node.intra_link), per_call


def cuda_type(device: str = "cuda") -> GpuType:
    """This host's GPU as a GpuType keyed "cuda" (the profile measured here uses that key)."""
    import torch
    props = torch.cuda.get_device_properties(torch.device(device))
    return GpuType(name="cuda", display_name=props.name, memory_bytes=props.total_memory,
                   memory_bandwidth_Bps=1e12, peak_fp32_flops=1e13, peak_fp16_flops=1e13,
                   sources=("placeholder rates: executor runs use profiles measured on this GPU",))


def cpu_time_profile(model: str, batch: int, repeats: int, model_kwargs: dict) -> ModelProfile:
    """modelzoo.profiler's per-layer profile, timed in thread CPU seconds instead of wall seconds.

    The simulator shares a node's cores among busy ranks as a fluid: a layer's cost is CPU work, and
    contention (from other ranks or other jobs, measured by `available_cores`) stretches it. Timing the
    profile by wall clock on a loaded host would count the contention twice. With one torch thread,
    forwards and backwards of CPU tensors run on the calling thread, so its CPU clock sees all work.
    """
    from types import SimpleNamespace

    import modelzoo.profiler as profiler
    wall = profiler.time
    profiler.time = SimpleNamespace(perf_counter=time.thread_time)   # the profiler's only clock call
    try:
        profile = profiler.measure_profile(model, batch, device_type="cpu", threads=1, repeats=repeats,
                                           **model_kwargs)
        return replace(profile, source=profile.source + ", timed in thread CPU seconds")
    finally:
        profiler.time = wall


def validate_plan(plan: Plan, *, model: str | None = None, model_kwargs: dict | None = None, waves: int = WAVES,
                  warmup_waves: int | None = None, slowdown: dict[str, float] | None = None, cores: float | None = None,
                  link_Bps: float | None = None, latency_s: float | None = None, seed: int = 0,
                  profile_repeats: int = 5, colocated_work: float | None = None,
                  profile: ModelProfile | None = None, device: str = "cpu", data: str = "random",
                  inputs: dict | None = None):
    """(prediction, measurement) of one plan on this host, predicted from profiles measured here
    just before and just after the run (`bracketed`; or `profile`, measured earlier on this host at
    the plan's minibatch size, with the optimiser's work measured at both ends). `warmup_waves`
    defaults to `default_warmup(waves)`; `colocated_work` to the factor measured now for the plan's
    stages (executor.colocation; 1.0 for one stage rank). `device` "cuda" runs the ranks on GPUs
    (see the module docstring; `cores` then means the shared GPU's concurrency). `data` "teacher"
    trains on a learnable task (experiments/time_to_accuracy), at the same cost as "random". A given
    `inputs` dict receives what the prediction was made from (plan, cluster, profile, slowdown,
    waves, warmup_waves, seed), for write_inputs."""
    import hetsim
    from executor import ExecOptions, launch
    from executor.calibrate import optimizer_seconds

    warmup_waves = default_warmup(waves) if warmup_waves is None else warmup_waves
    plan, model, slowdown, names = _checked_onto_host(plan, model, model_kwargs, slowdown, device, waves,
                                                      warmup_waves)
    cluster, handoff_s = _host_now(plan, model, model_kwargs, slowdown, cores, link_Bps, latency_s, colocated_work,
                                   device)
    key = cluster.gpus[0].type.name
    given = profile
    tensor_parallel = any(s.tp > 1 for vw in plan.virtual_workers for s in vw.stages)
    call_s = 0.0
    if tensor_parallel:
        from executor.placement import uses_nccl
        cluster, call_s = with_collective_latency(cluster, plan, model, model_kwargs or {}, device,
                                                  uses_nccl(device, "auto", len(plan.gpus)))

    def host_profile() -> ModelProfile:
        measured = with_counted_bytes(given or _profile(model, plan.minibatch_size, profile_repeats,
                                                        model_kwargs or {}, device, plan.precision),
                                      model, model_kwargs or {})
        return with_optimizer_costs(measured, optimizer_seconds(
            model, schedule=plan.schedule, nm=plan.nm, wsp=plan.sync.mode == "wsp", bsp=plan.sync.mode == "bsp",
            model_kwargs=model_kwargs, device=device, optimizer=plan_optimizer(plan)), key)
    before = host_profile()
    measurement = launch(plan, cluster, model, profile=before, model_kwargs=model_kwargs,
                         options=ExecOptions(waves=waves, warmup_waves=warmup_waves, seed=seed,
                                             slowdown=slowdown, data=data, device=device))
    def simulate(on: Cluster, slowed=slowdown, cv: float = 0.0, at_seed: int = seed):
        return hetsim.simulate(on, predicted_with, plan, waves=waves, warmup_waves=warmup_waves, seed=at_seed,
                               slowdown=slowed, jitter_cv=cv)
    with _in_plan_names(names):
        predicted_with = bracketed(before, host_profile(), plan, cluster, waves, slowdown)
        prediction = simulate(cluster)
    if inputs is not None:      # the plan as predicted: the model the run trained, which --model may name
        inputs.update(plan=replace(plan, model=model), cluster=cluster, profile=predicted_with, slowdown=slowdown,
                      waves=waves, warmup_waves=warmup_waves, seed=seed)
    _annotate(measurement.training, plan, cluster, predicted_with, measurement, device)
    measurement.training["handoff_s"] = handoff_s     # part of the link latency the prediction used
    measurement.training["tp_allreduce_call_s"] = call_s     # one measured call (0: no TP stage)
    at_measured = measured_work_slowdown(measurement, slowdown)
    if at_measured is not None and _orders_agree(plan, cluster, predicted_with, waves, slowdown, at_measured):
        # The simulator's own share of the error: the same prediction with each rank's measured work.
        with _in_plan_names(names):
            measurement.training["predicted_samples_s_at_measured_work"] = \
                simulate(cluster, at_measured).throughput["samples_per_s"]
            # ... and with the passes varying as much as the run's did (the simulator's jitter), over
            # JITTER_SEEDS draws: one draw over a run's window moves the rate by a percent or two.
            cv = measured_work_cv(measurement)
            if cv:
                measurement.training["work_cv"] = cv
                measurement.training["predicted_samples_s_at_measured_work_and_cv"] = statistics.fmean(
                    simulate(cluster, at_measured, cv, seed + k).throughput["samples_per_s"]
                    for k in range(JITTER_SEEDS))
    if handoff_s:
        # What the hand-off is worth in this run: the same prediction with the link's latency alone.
        node = cluster.nodes[0]
        alone = host_cluster(len(node.gpus), node.shared_cores, node.intra_link.bandwidth_Bps,
                             node.intra_link.latency_s - handoff_s, node.colocated_work, copy_cores=node.copy_cores,
                             collective_latency_s=node.intra_link.collective_latency_s)
        measurement.training["predicted_samples_s_without_handoff"] = simulate(alone).throughput["samples_per_s"]
    return prediction, measurement


def fits_host(plan: Plan, cluster: Cluster, profile: ModelProfile, memories: int | None,
              slowdown: dict[str, float] | None = None) -> None:
    """Before the run, the plan's predicted memory on this host: each rank within its device's
    (hetsim.feasibility.check_plan, naming the stage), and, where ranks share a memory, each memory's
    ranks within it together: `memories` of them, rank i (host/gpu<i>) on memory i mod `memories`
    (`shared_memories`); None where each rank has its own. What the check cannot see (parameter-server
    and scheduler processes, CUDA ranks' host memory) may still run short."""
    from hetsim.feasibility import check_plan
    memory = check_plan(plan, cluster, profile, slowdown)      # of the order the run follows
    if not memories:
        return
    device_type = cluster.gpus[0].type
    for m in range(memories):
        ranks = [g for g in memory if int(g.rsplit("gpu", 1)[1]) % memories == m]
        need = sum(memory[g].total_bytes for g in ranks)
        if need > device_type.memory_bytes:
            fullest = max(ranks, key=lambda g: memory[g].total_bytes)
            where = "this host's memory" if device_type.name == "cpu" else f"GPU {m}"
            raise PlanError(f"plan: {len(ranks)} ranks share {where} ({device_type.display_name}, "
                            f"{device_type.memory_gib:.1f} GiB) and need {need / GIB:.2f} GiB together (the "
                            f"fullest, {fullest}: {memory[fullest].describe()}); lower Nm or the minibatch")


def shared_memories(device: str, ranks: int, gpus: int) -> int | None:
    """How many memories `ranks` stage ranks share on `device` (executor.placement): CPU ranks the
    host's one, "cuda:N" ranks that GPU, "cuda" ranks with fewer GPUs than ranks the GPUs round-robin;
    None where each rank has a GPU of its own."""
    if device == "cpu" or ":" in device:
        return 1
    return gpus if ranks > gpus else None


def _checked_onto_host(plan: Plan, model: str | None, model_kwargs: dict | None, slowdown: dict[str, float] | None,
                       device: str, waves: int, warmup_waves: int) -> tuple[Plan, str, dict[str, float], dict]:
    """The plan on this host's GPU names, its model and slowdowns, once every input is known to be
    runnable: the rules every command enforces and its memory on this host, before a minute of
    measuring; and the renaming (onto_host)."""
    from executor import ExecOptions
    from executor.launch import check_job_plan
    from executor.placement import gpu_count
    ExecOptions(device=device, waves=waves, warmup_waves=warmup_waves)   # malformed options are named here
    if device != "cpu" and gpu_count() == 0:
        raise HetsimError(f"--device {device}: torch sees no CUDA device on this host; use cpu")
    check_job_plan(plan, None, model or plan.model, model_kwargs)       # in the plan's own GPU names
    if plan.blocking_p2p and schedule_kind(plan.schedule).explicit_p2p:
        raise HetsimError(f"blocking_p2p: under {plan.schedule} it predicts sends that hold their sender alone, "
                          "but the executor's transfers are rendezvous holding both ends; drop it to validate")
    plan, names = onto_host(plan)
    unknown = sorted(g for g in (slowdown or {}) if g not in names and g not in names.values())
    if unknown:
        raise HetsimError(f"--slowdown {unknown[0]}: the plan has no GPU of that name; it uses {', '.join(names)}")
    model = model or plan.model
    slowdown = {names.get(g, g): f for g, f in (slowdown or {}).items()}
    with _in_plan_names(names):
        _fits_before_measuring(plan, model, model_kwargs or {}, device, slowdown)
    return plan, model, slowdown, names


@contextlib.contextmanager
def _in_plan_names(names: dict[str, str]):
    """A plan rule broken on this host's rank slots (host/gpu<i>) is told in the plan's own GPU names
    (onto_host's `names`), as every other rule is."""
    ours = {host: name for name, host in names.items()}
    try:
        yield
    except PlanError as exc:
        raise PlanError(re.sub(r"(?<![\w/])host/gpu\d+\b", lambda m: ours.get(m[0], m[0]), str(exc))) from None


def _fits_before_measuring(plan: Plan, model: str, model_kwargs: dict, device: str,
                           slowdown: dict[str, float]) -> None:
    """fits_host from the model's counted bytes alone, before any profile or probe (which a model too
    big for the host could exhaust too). Times, which only shape a hetpipe order, are nominal: each
    layer's FLOPs at the device type's peak, times the run's `slowdown` of its GPU."""
    from executor.placement import gpu_count
    device_type = cpu_type() if device == "cpu" else cuda_type(device)
    rate, key = device_type.peak_fp32_flops, device_type.name
    counted = _counts(model, plan.minibatch_size, model_kwargs)
    profile = replace(counted, layers=tuple(replace(l, fwd_s={key: l.flops_fwd / rate}, bwd_s={key: 2 * l.flops_fwd / rate})
                                            for l in counted.layers))
    ranks = len(dict.fromkeys(plan.gpus))
    fits_host(plan, host_cluster(ranks, None, 1e9, 0.0, device_type=device_type), profile,
              shared_memories(device, ranks, gpu_count()), slowdown)


def _annotate(training: dict, plan: Plan, cluster, profile: ModelProfile, measurement, device: str) -> None:
    """What a reader of the measurement needs beside it to judge the prediction: each rank's
    predicted work, how far the measured work drifted from it, and the host's state around the run."""
    key, node = cluster.gpus[0].type.name, cluster.nodes[0]
    # As the simulator charges it (hetsim.sim.world.Device): x colocated_work where ranks share cores.
    colocated = node.colocated_work if node.shared_cores else 1.0
    work: dict[str, float] = {}
    for vw in plan.virtual_workers:
        for s in vw.stages:             # a rank of an interleaved schedule holds several chunks
            times = profile.stage_times_tp(key, *s.layers, s.tp)     # a TP member's: its @tp times, or over t
            for g in s.members:
                work[g] = work.get(g, 0.0) + (times.fwd_s + times.bwd_s) * colocated
    training["predicted_work_s_per_minibatch"] = work
    if device != "cpu":
        training["gpu_concurrency"] = node.shared_cores
    errors = [abs(w.error_pct) for w in work_rows(measurement) if w.error_pct is not None]
    # None where no rank's work could be compared (work_rows), not a perfect 0.
    training["cpu_work_drift"] = {"max_abs_error_pct": round(max(errors), 1) if errors else None,
                                  "tolerance_pct": WORK_DRIFT_PCT}
    # Load that came or went during the run is not in the prediction: measure again to tell.
    if device == "cpu":
        training["cores_available"] = {"before": node.shared_cores, "after": available_cores()}
    training["colocated_work"] = node.colocated_work


def write_inputs(inputs: dict, folder: str) -> str:
    """Write what a prediction was made from (validate_plan's `inputs`) as files `hetsim simulate`
    takes, with command.txt: the command that predicts it again, run in that folder (its paths are the
    files' names, so the folder may move). Returns the command with the folder's path, for printing."""
    import shlex

    from hetsim.cluster import save_cluster
    from hetsim.plan import save_plan
    from hetsim.profile_files import save_profile
    os.makedirs(folder, exist_ok=True)
    names = {"plan": "plan.json", "cluster": "cluster.yaml", "profile": "profile.yaml"}
    save_plan(inputs["plan"], os.path.join(folder, names["plan"]))
    save_profile(inputs["profile"], os.path.join(folder, names["profile"]))
    save_cluster(inputs["cluster"], os.path.join(folder, names["cluster"]))

    def command(where: str) -> str:
        args = ["hetsim", "simulate", *(x for k in ("cluster", "profile", "plan")
                                        for x in (f"--{k}", os.path.join(where, names[k]))),
                "--waves", str(inputs["waves"]), "--warmup-waves", str(inputs["warmup_waves"]),
                "--seed", str(inputs["seed"]), "--jitter", "0"]        # validate predicts without jitter
        for gpu, factor in sorted(inputs["slowdown"].items()):
            args += ["--slowdown", f"{gpu}={factor!r}"]
        return shlex.join(args)
    with open(os.path.join(folder, "command.txt"), "w") as f:
        f.write(f"# run in this folder (or: python -m hetsim ...)\n{command('')}\n")
    return command(folder)


def _host_now(plan: Plan, model: str, model_kwargs, slowdown, cores, link_Bps, latency_s, colocated_work,
              device: str) -> tuple[Cluster, float]:
    """This host as it is now, and the hand-off delay in its link's latency: the link, the cores (or
    the shared GPU's concurrency) and the stages' co-located work measured unless given. A measured
    CPU latency adds the scheduler's hand-off delay where the plan's other ranks can fill the cores
    (executor.calibrate.handoff_delay); a given latency is taken whole."""
    from executor.calibrate import handoff_delay, link_speed
    from executor.placement import gpu_count, uses_nccl

    stages = [s for vw in plan.virtual_workers for s in vw.stages]
    # One probe per rank: a tensor-parallel stage's members each run their share of its layers.
    ranks = [(s, k) for s in stages for k in range(s.tp)]
    # Each probe does the optimiser work of the plan's schedule (per minibatch, or per wave).
    probes = {"tp": [(k, s.tp) for s, k in ranks], "schedule": plan.schedule, "nm": plan.nm, "sync": plan.sync.mode,
              "optimizer": plan_optimizer(plan)}
    nccl = uses_nccl(device, "auto", len(ranks))
    latency_measured = latency_s is None
    if link_Bps is None or latency_s is None:
        measured_latency, measured_Bps = link_speed(device=device, nccl=nccl and gpu_count() > 1)
        link_Bps, latency_s = link_Bps or measured_Bps, latency_s if latency_s is not None else measured_latency
    if device != "cpu":
        from executor.colocation import gpu_concurrency
        if cores is None and shared_memories(device, len(ranks), gpu_count()):     # ranks share a GPU
            cores = round(gpu_concurrency(model, [s.layers for s, _ in ranks], batch=plan.minibatch_size,
                                          model_kwargs=model_kwargs, device=device, **probes), 2)
        # Ranks sharing a GPU: their gloo copies run on the host's cores, taking no GPU time from the
        # other ranks (experiments/validation/shared_gpu.py measured it on an H200).
        return host_cluster(len(dict.fromkeys(plan.gpus)), cores, link_Bps, latency_s, colocated_work or 1.0,
                            cuda_type(device), copy_cores=max(1, int(usable_cores()))), 0.0
    if colocated_work is None:
        from executor.colocation import colocation_factor
        colocated_work = colocation_factor(model, [s.layers for s, _ in ranks], batch=plan.minibatch_size,
                                           model_kwargs=model_kwargs,
                                           slowdowns=[slowdown.get(s.members[k], 1.0) for s, k in ranks], **probes)
    cores = cores or available_cores()
    handoff = handoff_delay(len(ranks), cores) if latency_measured else 0.0
    return host_cluster(len(dict.fromkeys(plan.gpus)), cores, link_Bps, latency_s + handoff,
                        round(colocated_work, 3)), handoff


def _profile(model: str, batch: int, repeats: int, model_kwargs: dict, device: str,
             precision: str = "fp32") -> ModelProfile:
    """Per-layer seconds on this host: thread CPU seconds on CPU, CUDA events on a GPU (key "cuda"), the
    latter in the plan's math (TF32 on or off), as the executor's ranks run it."""
    if device == "cpu":
        return cpu_time_profile(model, batch, repeats, model_kwargs)
    import modelzoo.profiler as profiler
    return profiler.measure_profile(model, batch, device=device, device_type="cuda", threads=1, repeats=repeats,
                                    precision=precision, **model_kwargs)


def bracketed(before: ModelProfile, after: ModelProfile, plan: Plan, cluster: Cluster, waves: int,
              slowdown: dict[str, float] | None = None) -> ModelProfile:
    """The mean of profiles taken just before and just after a run, for its prediction: this VM's speed
    drifts (the same 15-pass profile read 4-6% apart across one 30 s run), and the mean follows the
    speed over the run where one side of it does not. Neither profile is timed from the run itself.
    The executor ordered a hetpipe schedule by `before` and the emulated `slowdown`; if the mean would
    order it otherwise, the prediction keeps `before`, so that both sides replay one schedule."""
    layers = tuple(replace(b, fwd_s={k: (v + a.fwd_s[k]) / 2 for k, v in b.fwd_s.items()},
                           bwd_s={k: (v + a.bwd_s[k]) / 2 for k, v in b.bwd_s.items()})
                   for b, a in zip(before.layers, after.layers))
    mean = replace(before, layers=layers, source=before.source + "; mean of profiles before and after the run")
    same = _schedules(plan, cluster, mean, waves, slowdown) == _schedules(plan, cluster, before, waves, slowdown)
    return mean if same else before


def _orders_agree(plan: Plan, cluster: Cluster, profile: ModelProfile, waves: int, slowdown, other) -> bool:
    """Whether per-GPU slowdowns `other` leave a cost-ordered (hetpipe) schedule as `slowdown` orders
    it: a prediction with them would otherwise replay another schedule than the run."""
    return (not schedule_kind(plan.schedule).needs_costs
            or _schedules(plan, cluster, profile, waves, slowdown) == _schedules(plan, cluster, profile, waves, other))


def _schedules(plan: Plan, cluster: Cluster, profile: ModelProfile, waves: int, slowdown) -> list:
    """Every VW's schedule as the executor and the simulator build it from this profile and slowdown."""
    from hetsim.feasibility import vw_schedule
    at_batch = profile.scaled_to_batch(plan.minibatch_size)
    return [vw_schedule(plan, vw, cluster, at_batch, waves, slowdown=slowdown) for vw in plan.virtual_workers]


def load_changed(measurement, tolerance: float = LOAD_TOLERANCE) -> str | None:
    """A warning when the cores our ranks could get differed before and after the run."""
    cores = measurement.training.get("cores_available")
    if not cores or abs(cores["after"] - cores["before"]) <= tolerance:
        return None
    return (f"the cores available to our ranks changed during the run ({cores['before']} before, "
            f"{cores['after']} after): other load on this host makes this comparison unreliable")


def work_drift(measurement, tolerance: float = WORK_DRIFT_PCT) -> str | None:
    """A warning when some rank's measured work per minibatch differs from the profile's prediction
    by more than `tolerance` percent: the profile around the run did not describe the work the ranks did."""
    drifted = [w for w in work_rows(measurement) if w.error_pct is not None and abs(w.error_pct) > tolerance]
    if not drifted:
        return None
    worst = max(drifted, key=lambda w: abs(w.error_pct))
    return (f"{len(drifted)} rank(s) did work differing from the profile's by more than {tolerance:g}% "
            f"(worst {worst.metric.rsplit(' ', 3)[0]}: {worst.predicted:.1f} ms predicted, {worst.measured:.1f} "
            f"measured, {worst.error_pct:+.1f}%): the prediction's inputs, not the simulator, may explain its error")


def compared_work(measurement) -> list[tuple]:
    """(rank, profiled work, measured work) per minibatch, in seconds, for each rank whose work can be
    compared: thread CPU time of forward, backward and optimiser on CPU, without emulation
    (independent of host load); on CUDA the wall time until the GPU finished them. On CUDA none for
    ranks sharing one GPU, whose wall time holds their waits for the GPU, nor for tensor-parallel
    members, whose forward and backward hold their all-reduces: neither tells whether the profile
    described the work."""
    cuda = measurement.settings.get("device", "cpu") != "cpu"
    if cuda and measurement.training.get("gpu_concurrency"):
        return []
    measured = measurement.training["compute_work_s_per_minibatch"]
    predicted = measurement.training["predicted_work_s_per_minibatch"]
    return [(g, predicted[g.id], measured[g.id]) for g in measurement.gpus if not (cuda and g.tp > 1)]


def work_rows(measurement) -> list:
    """Per rank: profiled work per minibatch vs the work the executor's ranks measured (compared_work)."""
    from hetsim.compare import Comparison
    what = "GPU" if measurement.settings.get("device", "cpu") != "cpu" else "CPU"
    return [Comparison(metric=f"{g.id} [{g.vw} s{g.stage}{f' tp{g.tp}' if g.tp > 1 else ''}] {what} work ms/minibatch",
                       predicted=1e3 * predicted, measured=1e3 * measured)
            for g, predicted, measured in compared_work(measurement)]


def measured_work_cv(measurement: Report) -> float:
    """The mean over stage ranks of how much one pass's work varied from the next in the run
    (executor.measure's compute_work_cv), 0.0 where none was measured."""
    cvs = list(measurement.training.get("compute_work_cv", {}).values())
    return round(statistics.fmean(cvs), 4) if cvs else 0.0


def measured_work_slowdown(measurement, slowdown: dict[str, float] | None) -> dict[str, float] | None:
    """Per-rank slowdowns under which the simulator charges each rank the work it measured in the run
    (the emulated slowdown times measured over profiled work), so that a prediction made with them
    leaves out what the profile got wrong and keeps what the simulator does: its schedule, transfers
    and shared cores. None unless every rank's work was compared (compared_work): a tensor-parallel
    member's is on CPU, whose thread CPU seconds leave out gloo's all-reduces (they run on gloo's own
    threads while the caller waits), but not on CUDA, whose passes' GPU time holds them."""
    compared = compared_work(measurement)
    if (not compared or len(compared) != len(measurement.gpus)
            or any(p <= 0 or m <= 0 for _, p, m in compared)):
        return None
    return {g.id: (slowdown or {}).get(g.id, 1.0) * measured / predicted for g, predicted, measured in compared}


def _refuse_bad_input(args: argparse.Namespace, plan: Plan, model_kwargs: dict) -> None:
    """Everything that can be checked before a minute of measuring: the output folder, the options
    (named as flags) and the plan rules every command enforces (named in the plan's file)."""
    from executor import ExecOptions
    from executor.launch import check_job_plan
    from hetsim.cli.arguments import check_output_dir
    from hetsim.cli.simulate import in_plan_file

    if args.out:
        check_output_dir(args.out, "--out")
    warmup = default_warmup(args.waves) if args.warmup_waves is None else args.warmup_waves
    try:
        ExecOptions(device=args.device, waves=args.waves, warmup_waves=warmup)
    except HetsimError as exc:                 # "warmup_waves: ..." is --warmup-waves here
        field, _, reason = str(exc).partition(": ")
        raise HetsimError(f"--{field.replace('_', '-')}: {reason}") from None
    try:
        check_job_plan(plan, None, args.model or plan.model, model_kwargs)
    except PlanError as exc:
        raise in_plan_file(exc, args.plan) from None
    except HetsimError as exc:       # an unknown model: --model's, or the plan file's own
        if not str(exc).startswith("model: "):
            raise
        where = "--model" if args.model else f"{Path(args.plan).name}: model"
        raise HetsimError(f"{where}: {str(exc).removeprefix('model: ')}") from None


@contextlib.contextmanager
def _named_in(plan_file: str):
    """A plan rule broken on this host (its memory, before the run, or the prediction's, after it) is
    named in the plan's file, as the others are."""
    from hetsim.cli.simulate import in_plan_file
    try:
        yield
    except PlanError as exc:
        raise in_plan_file(exc, plan_file) from None


def run(args: argparse.Namespace) -> int:
    import hetsim
    from executor.__main__ import model_kwargs
    from hetsim.cli.progress import still_running
    from hetsim.cli.simulate import parse_slowdowns
    from hetsim.compare import compare_reports, format_comparison, percent_error

    plan = hetsim.load_plan(args.plan)
    _refuse_bad_input(args, plan, model_kwargs(args.model_arg))
    inputs: dict = {}
    with still_running(f"validating {plan.name}: profiling, predicting, running the executor",
                       quiet=getattr(args, "quiet", False)), _named_in(args.plan):
        prediction, measurement = validate_plan(
            plan, model=args.model, model_kwargs=model_kwargs(args.model_arg), waves=args.waves,
            warmup_waves=args.warmup_waves, slowdown=parse_slowdowns(args.slowdown), cores=args.cores,
            link_Bps=args.link_GBps * 1e9 if args.link_GBps else None,
            latency_s=args.latency_us * 1e-6 if args.latency_us is not None else None, seed=args.seed,
            colocated_work=args.colocated_work, device=args.device, inputs=inputs)
    if args.device == "cpu":
        cores = measurement.training["cores_available"]["before"]
        where = (f"{cores} of {usable_cores():g} cores available, shared by {len(measurement.gpus)} stage ranks, "
                 f"compute x{measurement.training['colocated_work']} co-located"
                 + (f", {measurement.training['handoff_s'] * 1e3:.2f} ms hand-off a message"
                    if measurement.training["handoff_s"] else ""))
    else:
        shared = measurement.training["gpu_concurrency"]
        where = (f"{len(measurement.gpus)} stage ranks on {args.device}, "
                 + (f"one GPU shared, concurrency {shared}" if shared else "a GPU each"))
    if measurement.training["tp_allreduce_call_s"]:
        where += f", {measurement.training['tp_allreduce_call_s'] * 1e3:.2f} ms a TP all-reduce call"
    print(f"validate: plan {plan.name} on this host ({where}), {args.waves} waves, "
          f"{measurement.settings['warmup_waves']} warm-up")
    print(format_comparison(compare_reports(prediction, measurement) + work_rows(measurement)))
    replayed = measurement.training.get("predicted_samples_s_at_measured_work")
    if replayed:
        error = percent_error(replayed, measurement.throughput["samples_per_s"])
        print(f"at the work each rank measured instead of the profile's, the simulator predicts {replayed:.1f} "
              f"samples/s ({error:+.1f}%): the rest of the error is the profile's")
    varied = measurement.training.get("predicted_samples_s_at_measured_work_and_cv")
    if varied:
        error = percent_error(varied, measurement.throughput["samples_per_s"])
        print(f"... and with each pass's work varying as in the run (the simulator's --jitter at cv "
              f"{measurement.training['work_cv']:.3f}, mean of {JITTER_SEEDS} draws): {varied:.1f} samples/s "
              f"({error:+.1f}%)")
    for note in measurement.notes[1:]:
        print(f"note: {note}")
    for warning in (load_changed(measurement), work_drift(measurement)):
        if warning:
            print(f"warning: {warning}")
    if args.out:
        from hetsim.convergence import attach_time_to_accuracy
        # as `hetsim simulate` (inputs/command.txt) attaches it
        attach_time_to_accuracy(prediction, param_bytes=inputs["profile"].param_bytes)
        prediction.write(os.path.join(args.out, "prediction"))
        measurement.write(os.path.join(args.out, "measurement"))
        again = write_inputs(inputs, os.path.join(args.out, "inputs"))
        print(f"wrote {args.out}/prediction, {args.out}/measurement and {args.out}/inputs (predict again: {again})")
    return 0
