"""This executor vs torch.distributed.pipelining (ScheduleGPipe, Schedule1F1B) on CPU with gloo.

Same model (modelzoo mlp, 8 hidden layers of 512), same partition (balanced cuts), same microbatch
count and size, SGD with momentum, one torch thread per rank, the same malloc settings
(modelzoo.allocator). A pipelining step is one minibatch of
Nm microbatches and one optimiser step: our flush schedules' wave (gpipe <-> ScheduleGPipe,
1f1b-flush <-> Schedule1F1B). Both are timed after warm-up steps, in samples per second.

    python benchmarks/bench_executor.py [--steps 30] [--warmup 10] [--repeats 3]

Each case runs ours and theirs alternately `repeats` times; the table gives medians. Prints a table;
asserts nothing. Timings on a shared host are noisy: compare within one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import executor
import modelzoo
from executor.validate import host_cluster
from hetsim.plan import Plan, StageSpec, SyncSpec, VirtualWorker

KWARGS, MICROBATCH = {"hidden": 512, "depth": 8}, 32
CUTS = {2: [0, 8, 17], 4: [0, 4, 8, 12, 17]}


def ours(n_stages: int, nm: int, schedule: str, steps: int, warmup: int) -> float:
    cuts = CUTS[n_stages]
    plan = Plan(name=f"bench_{schedule}", model="mlp", minibatch_size=MICROBATCH, nm=nm, schedule=schedule,
                sync=SyncSpec(), virtual_workers=(VirtualWorker(name="vw0", stages=tuple(
                    StageSpec(gpu=f"host/gpu{s}", layers=(cuts[s], cuts[s + 1])) for s in range(n_stages))),))
    report = executor.launch(plan, host_cluster(n_stages, os.cpu_count(), 2e9, 5e-5), model_kwargs=KWARGS,
                             options=executor.ExecOptions(waves=warmup + steps, warmup_waves=warmup, data="random"))
    return report.throughput["samples_per_s"]


def _theirs_rank(rank: int, world: int, schedule: str, nm: int, steps: int, warmup: int, tmp: str) -> None:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from modelzoo.allocator import steady_allocator
    steady_allocator()                        # the malloc settings our ranks run with, for a like comparison
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    torch.manual_seed(0)
    graph = modelzoo.layer_graph(modelzoo.build("mlp", batch=1, **KWARGS)[0])
    lo, hi = CUTS[world][rank], CUTS[world][rank + 1]
    submodule = nn.Sequential(*[graph.layers[i] for i in range(lo, hi)])
    stage = PipelineStage(submodule, rank, world, torch.device("cpu"))
    cls = {"gpipe": ScheduleGPipe, "1f1b-flush": Schedule1F1B}[schedule]
    pipe = cls(stage, n_microbatches=nm, loss_fn=nn.functional.cross_entropy)
    opt = torch.optim.SGD(submodule.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(nm * MICROBATCH, 64, generator=g), torch.randint(10, (nm * MICROBATCH,), generator=g)
    start = 0.0
    for k in range(warmup + steps):
        if k == warmup:
            dist.barrier()
            start = time.perf_counter()
        opt.zero_grad()
        if rank == 0:
            pipe.step(x)
        elif rank == world - 1:
            pipe.step(target=y, losses=[])
        else:
            pipe.step()
        opt.step()
    dist.barrier()
    if rank == 0:
        Path(tmp, "seconds").write_text(str(time.perf_counter() - start))
    dist.destroy_process_group()


def theirs(n_stages: int, nm: int, schedule: str, steps: int, warmup: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_theirs_rank, args=(n_stages, schedule, nm, steps, warmup, tmp), nprocs=n_stages,
                           join=True, start_method="spawn")
        seconds = float(Path(tmp, "seconds").read_text())
    return steps * nm * MICROBATCH / seconds


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    print(f"host: {os.cpu_count()} cores, 1-min load average {os.getloadavg()[0]:.1f}; mlp {KWARGS}, "
          f"microbatch {MICROBATCH}, {args.steps} timed steps after {args.warmup}, median of {args.repeats} "
          "alternating runs")
    print(f"| schedule (ours / torch.distributed.pipelining) | stages | Nm | ours samples/s | pipelining samples/s | ours / theirs |")
    print("|---|---|---|---|---|---|")
    for n_stages, nm in ((2, 4), (4, 4), (4, 8)):
        for schedule, name in (("gpipe", "ScheduleGPipe"), ("1f1b-flush", "Schedule1F1B")):
            runs = [(ours(n_stages, nm, schedule, args.steps, args.warmup),
                     theirs(n_stages, nm, schedule, args.steps, args.warmup)) for _ in range(args.repeats)]
            a, b = statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)
            print(f"| {schedule} / {name} | {n_stages} | {nm} | {a:.0f} | {b:.0f} | {a / b:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
