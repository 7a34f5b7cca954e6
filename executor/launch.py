"""Start the ranks (torch.multiprocessing here, or torchrun through executor.__main__), gather their
records on rank 0 and build the measured Report."""

from __future__ import annotations

import os
import pickle
import tempfile
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
import torch.multiprocessing as mp

import modelzoo
from executor.layout import RankLayout
from executor.measure import build_measured_report
from executor.options import ExecOptions
from executor.worker import Job, job_layout, run_rank
from hetsim.cluster import Cluster, load_cluster
from hetsim.plan import Plan, load_plan
from hetsim.profile import ModelProfile, load_profile
from hetsim.report import Report

__all__ = ["launch", "make_job", "rank_main", "report_from_records"]


def make_job(plan: Plan | str | Path, cluster: Cluster | str | Path, model: str | None = None, *,
             profile: ModelProfile | str | Path | None = None, options: ExecOptions = ExecOptions()) -> Job:
    plan = plan if isinstance(plan, Plan) else load_plan(plan)
    cluster = cluster if isinstance(cluster, Cluster) else load_cluster(cluster)
    if profile is not None and not isinstance(profile, ModelProfile):
        profile = load_profile(profile)
    return Job(plan=plan, cluster=cluster, model=model or plan.model, options=options, profile=profile)


def layout_of(job: Job) -> RankLayout:
    model, _ = modelzoo.build(job.model, batch=1)
    return job_layout(job, len(modelzoo.layer_graph(model)))


def rank_main(rank: int, world_size: int, job: Job, init_method: str, records_path: str | None) -> object:
    """One rank: join the group, run, gather every record on rank 0 (written to records_path)."""
    dist.init_process_group(job.options.backend_name, init_method=init_method, rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=job.options.timeout_s))
    try:
        record = run_rank(rank, job)
        gathered = [None] * world_size if rank == 0 else None
        dist.gather_object(record, gathered, dst=0)
        if rank == 0 and records_path:
            Path(records_path).write_bytes(pickle.dumps(gathered))
        return gathered
    finally:
        dist.destroy_process_group()


def _spawned(rank: int, world_size: int, job: Job, init_method: str, records_path: str) -> None:
    rank_main(rank, world_size, job, init_method, records_path)


def report_from_records(job: Job, records: list) -> Report:
    return build_measured_report(job, layout_of(job), records, job.schedules())


def launch(plan: Plan | str | Path, cluster: Cluster | str | Path, model: str | None = None, *,
           profile: ModelProfile | str | Path | None = None, options: ExecOptions = ExecOptions(),
           out: str | Path | None = None) -> Report:
    """Run the plan for real on this host (one process per rank) and return the measured Report."""
    job = make_job(plan, cluster, model, profile=profile, options=options)
    world_size = layout_of(job).world_size
    with tempfile.TemporaryDirectory(prefix="hetsim-exec-") as tmp:
        records_path = os.path.join(tmp, "records.pkl")
        mp.start_processes(_spawned, args=(world_size, job, f"file://{tmp}/store", records_path),
                           nprocs=world_size, join=True, start_method="spawn")
        records = pickle.loads(Path(records_path).read_bytes())
    report = report_from_records(job, records)
    if out is not None:
        report.write(out)
    return report
