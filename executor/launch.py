"""Start the ranks (processes here, or torchrun through executor.__main__), gather their records on
rank 0 and build the measured Report. A failed rank makes the launch raise ExecutorError naming it."""

from __future__ import annotations

import json
import os
import pickle
import tempfile
import time
import traceback
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

import modelzoo
from executor.checkpoint import fingerprint, start_checkpoints
from executor.children import die_with_parent, reap
from executor.health import ExecutorError, Health, process_state
from executor.layout import RankLayout
from executor.measure import build_measured_report
from executor.optimizer import plan_optimizer
from executor.options import ExecOptions
from executor.record import RankRecord
from executor.worker import Job, _check_supported, _resume_wave, check_tp_layers, job_layout, run_rank
from hetsim.cluster import Cluster, load_cluster
from hetsim.data import loaded
from hetsim.errors import HetsimError, PlanError
from hetsim.feasibility import check_structure
from hetsim.plan import Plan, load_plan
from hetsim.profile import ModelProfile
from hetsim.profile_files import load_profile
from hetsim.report import REPORT_FILES, Report
from hetsim.schedule.registry import schedule_kind

__all__ = ["launch", "make_job", "check_job_plan", "rank_main", "report_from_records", "ExecutorError",
           "torchrun_error", "one_line"]

_GRACE_S = 10.0            # after the first failure, how long the others get to exit on their own


def make_job(plan: Plan | str | Path, cluster: Cluster | str | Path, model: str | None = None, *,
             profile: ModelProfile | str | Path | None = None, options: ExecOptions = ExecOptions(),
             model_kwargs: dict | None = None) -> Job:
    plan, cluster = loaded("plan", plan, Plan, load_plan), loaded("cluster", cluster, Cluster, load_cluster)
    if profile is not None:
        profile = loaded("profile", profile, ModelProfile, load_profile)
    if not isinstance(options, ExecOptions) or not isinstance(model_kwargs, (dict, type(None))):
        raise HetsimError(f"options must be an ExecOptions and model_kwargs a dict, got "
                          f"{type(options).__name__} and {type(model_kwargs).__name__}")
    job = Job(plan=plan, cluster=cluster, model=model or plan.model, options=options, profile=profile,
              model_kwargs=tuple(sorted((model_kwargs or {}).items())))
    n_layers = check_job_plan(plan, cluster, job.model, model_kwargs)
    if profile is not None:
        _check_profile(profile, job.model, n_layers, plan, cluster)
    unknown = sorted(g for g in options.slowdown if g not in plan.gpus)
    if unknown:
        raise HetsimError(f"slowdown: {unknown[0]}: plan {plan.name} has no GPU of that name (it uses "
                          f"{', '.join(dict.fromkeys(plan.gpus))})")
    _check_supported(job)
    if len(plan.gpus) > sum(len(vw.stages) for vw in plan.virtual_workers):     # tensor-parallel stages
        check_tp_layers(job, _graph(job))
    return job


def _check_profile(profile: ModelProfile, model: str, n_layers: int, plan: Plan, cluster: Cluster) -> None:
    """The profile that orders a hetpipe schedule is of the model trained, layer for layer, with times
    for the plan's GPU types (as `hetsim simulate` asks of it)."""
    if profile.model != model or profile.n_layers != n_layers:
        raise HetsimError(f"profile: a profile of {profile.model!r} ({profile.n_layers} layers), but the job trains "
                          f"{model!r} ({n_layers} layers); give a profile of the model trained "
                          f"(hetsim profile --model {model})")
    if schedule_kind(plan.schedule).needs_costs:
        for gpu in dict.fromkeys(plan.gpus):
            profile.require_gpu_type(cluster.gpu(gpu).type.name)


def check_job_plan(plan: Plan, cluster: Cluster | None, model: str, model_kwargs: dict | None = None) -> int:
    """The plan rules simulate and plan enforce (hetsim.feasibility.check_structure), against the
    model's own layer count, before any rank starts: a plan whose stages stopped short of the last
    layer once trained a truncated model without a word. The model is built on the meta device
    (no weights), so this takes well under a second. make_job calls it for every Job, so the
    precision the executor trains at (FP32 weights and activations, fp32 or tf32 math), its lack of
    recomputation and the plan's optimizer are checked here. Returns the model's layer count."""
    if plan.precision not in ("fp32", "tf32"):
        raise PlanError(f"plan {plan.name}: precision {plan.precision}: the executor trains with FP32 "
                        "weights and activations (mixed precision is not implemented); run the plan at fp32 "
                        "or tf32")
    if plan.recompute:
        raise PlanError(f"plan {plan.name}: recompute: the executor keeps every activation for the backward "
                        "(recomputation is not implemented); run the plan with recompute false")
    plan_optimizer(plan)                     # an optimizer the executor runs, named or by its copies
    for name, value in (model_kwargs or {}).items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise HetsimError(f"model_kwargs: {name}={value!r}: a model's sizes are whole numbers >= 1")
    try:
        net, _ = modelzoo.build(model, batch=1, device="meta", **(model_kwargs or {}))
    except KeyError as exc:                  # modelzoo's "unknown model 'x'; did you mean ...?"
        raise HetsimError(f"model: {exc.args[0]}") from None
    except TypeError as exc:                 # a constructor argument the model does not take
        raise HetsimError(f"model {model}: {exc}") from None
    except ValueError as exc:                # arguments the model cannot be built with together
        raise HetsimError(f"{'--model-arg: ' if model_kwargs else ''}model {model}: {exc}") from None
    n_layers = len(modelzoo.layer_graph(net))
    check_structure(plan, cluster, n_layers, f"model {model}")
    return n_layers


def _graph(job: Job):
    # On the meta device: the layers' structure without their weights, which a model too big for this
    # host could not allocate (the ranks build the real thing, after the plan check said it fits).
    model, _ = modelzoo.build(job.model, batch=1, device="meta", **dict(job.model_kwargs))
    return modelzoo.layer_graph(model)


def layout_of(job: Job) -> RankLayout:
    return job_layout(job, len(_graph(job)))


def check_fault(job: Job, layout: RankLayout, resume: int | None = None) -> None:
    """A fault to inject names a stage rank of this run and an action that rank runs, after wave
    `resume`'s STEP when resuming (a fault that never fires would test nothing)."""
    spec = job.options.fault_spec
    if spec is None:
        return
    rank, action, _ = spec
    if rank >= layout.world_size:
        raise HetsimError(f"fault {job.options.fault!r}: this run has ranks 0..{layout.world_size - 1}")
    role = layout.roles[rank]
    if role.kind != "stage":
        raise HetsimError(f"fault {job.options.fault!r}: {layout.describe(rank)} runs no schedule actions; "
                          "name a stage rank")
    actions = [str(a) for a in job.schedules()[role.vw].stages[role.stage]]
    if resume is not None:
        actions = actions[actions.index(f"STEP{resume}") + 1:]
    if action not in actions:
        after = f" after resuming from wave {resume}" if resume is not None else ""
        raise HetsimError(f"fault {job.options.fault!r}: {layout.describe(rank)} never runs {action}{after} "
                          f"(its actions run {actions[0]} .. {actions[-1]})")


def rank_main(rank: int, world_size: int, job: Job, init_method: str, records_path: str | None,
              on_exit=lambda message: None) -> object:
    """One rank: join the group, run under the watchdog, gather every record on rank 0."""
    layout = layout_of(job)
    dist.init_process_group("gloo", init_method=init_method, rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=job.options.timeout_s))
    record = RankRecord(rank=rank)
    health = Health(dist.distributed_c10d._get_default_store(), rank, layout.describe,
                    timeout_s=job.options.timeout_s, position=lambda: (record.position, record.since),
                    on_exit=on_exit, world_size=world_size,
                    servers=frozenset(r.rank for r in layout.roles if r.kind != "stage"))
    health.start()
    try:
        run_rank(rank, job, record)
        record.waiting_on = [r for r in range(world_size) if r != rank]
        record.at("gather")
        gathered = [None] * world_size if rank == 0 else None
        dist.gather_object(record, gathered, dst=0)
    except RuntimeError as exc:             # gloo: a peer's connection reset, or a timeout
        raise health.failure(record.waiting_on, record.position, exc) from None
    health.stop()
    if rank == 0 and records_path:
        Path(records_path).write_bytes(pickle.dumps(gathered))
    dist.destroy_process_group()
    return gathered


def _child(rank: int, world_size: int, job: Job, init_method: str, tmp: str) -> None:
    (Path(tmp) / f"started{rank}").touch()  # got past importing the parent's script (see _wait)
    die_with_parent()
    error_path = Path(tmp) / f"error{rank}.txt"
    for name in ("LOCAL_RANK", "LOCAL_WORLD_SIZE"):    # a torchrun parent's: these ranks are ours
        os.environ.pop(name, None)
    try:
        rank_main(rank, world_size, job, init_method, os.path.join(tmp, "records.pkl"),
                  on_exit=error_path.write_text)
    except HetsimError as exc:               # said in one line (ExecutorError among them); the rest is a bug
        error_path.write_text(str(exc))
        os._exit(1)
    except BaseException:
        error_path.write_text(traceback.format_exc())
        os._exit(1)


def torchrun_error(message: str) -> None:
    """Under torchrun, this rank's error in its error file (TORCHELASTIC_ERROR_FILE): torchrun's failure
    summary shows it there, on every node, where it would otherwise say `error_file: <N/A>`."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if path:
        extra = {"py_callstack": message, "timestamp": str(int(time.time()))}
        Path(path).write_text(json.dumps({"message": {"message": message, "extraInfo": extra}}))


def one_line(exc: BaseException) -> str:
    """An unexpected exception as one line: its type, message and where it was raised."""
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" (at {Path(frame.filename).name}:{frame.lineno} in {frame.name})" if frame else ""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}{where}"


def report_from_records(job: Job, records: list) -> Report:
    return build_measured_report(job, layout_of(job), records, job.schedules())


def launch(plan: Plan | str | Path, cluster: Cluster | str | Path, model: str | None = None, *,
           profile: ModelProfile | str | Path | None = None, options: ExecOptions = ExecOptions(),
           out: str | Path | None = None, model_kwargs: dict | None = None) -> Report:
    """Run the plan for real on this host (one process per rank) and return the measured Report."""
    job = make_job(plan, cluster, model, profile=profile, options=options, model_kwargs=model_kwargs)
    layout = layout_of(job)
    check_fault(job, layout)
    if out is not None:
        from hetsim.cli.arguments import check_output_dir
        check_output_dir(out, "out", names=REPORT_FILES)      # before the run, not after it
    if options.checkpoint_dir:
        start_checkpoints(options.checkpoint_dir, fingerprint(job.plan.to_dict(), job.model, dict(job.model_kwargs)),
                          options.resume)
        # Nothing left to run, or a fault at an action the resumed run skips: said here, not by every rank.
        check_fault(job, layout, _resume_wave(job, layout))
    with tempfile.TemporaryDirectory(prefix="hetsim-exec-") as tmp:
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_child, args=(r, layout.world_size, job, f"file://{tmp}/store", tmp),
                             name=f"executor-rank{r}") for r in range(layout.world_size)]
        try:
            for p in procs:
                p.start()
            _wait(procs, layout, Path(tmp), job.options.timeout_s)
        finally:                         # an interrupt (Ctrl-C) too: no rank outlives the launch
            reap(procs)
        records = pickle.loads((Path(tmp) / "records.pkl").read_bytes())
    report = report_from_records(job, records)
    if out is not None:
        report.write(out, drop_figures=True)     # a prediction's figures there would contradict it
    return report


def _only_stopped_left(procs) -> bool:
    """After a failure, every rank still alive is stopped (SIGSTOP): none of them can exit on its own."""
    alive = [p for p in procs if p.is_alive()]
    return bool(alive) and all(process_state(p.pid) in ("T", "t") for p in alive)


def _wait(procs, layout: RankLayout, tmp: Path, timeout_s: float) -> None:
    """Wait for every rank; after the first failure the rest get timeout_s + grace to exit on their
    own (the watchdog's job); any still alive then are killed and reported."""
    deadline = None
    while any(p.is_alive() for p in procs):
        for p in procs:
            p.join(0.05)
        if deadline is None and any(p.exitcode not in (None, 0) for p in procs):
            deadline = time.monotonic() + timeout_s + _GRACE_S
        if deadline is not None and (time.monotonic() > deadline or _only_stopped_left(procs)):
            break
    stuck = [r for r, p in enumerate(procs) if p.is_alive()]
    stopped = {r for r in stuck if process_state(procs[r].pid) in ("T", "t")}
    for r in stuck:
        procs[r].kill()
        procs[r].join()
    failed = [r for r, p in enumerate(procs) if p.exitcode != 0]
    if not failed:
        return
    lines = []
    for r in failed:
        path = tmp / f"error{r}.txt"
        if r in stopped:
            lines.append(f"{layout.describe(r)}: stopped (SIGSTOP or a debugger); killed")
        elif r in stuck:
            lines.append(f"{layout.describe(r)}: did not exit within {timeout_s + _GRACE_S:.0f} s; killed")
        elif path.exists():
            lines.append(path.read_text().strip())
        else:
            lines.append(f"{layout.describe(r)}: exited with code {procs[r].exitcode} and no message (died)")
    if not any((tmp / f"started{r}").exists() for r in range(len(procs))):
        # Spawned ranks import the launching script first: unguarded, it launches again and they die.
        lines.append("no rank got as far as its first line: if a script calls executor.launch, call it under "
                     "`if __name__ == \"__main__\":` (each rank imports the script)")
    raise ExecutorError("run failed:\n  " + "\n  ".join(lines))
