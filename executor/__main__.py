"""torchrun entry point: `torchrun --nproc-per-node N -m executor --plan P --cluster C [...]`.

N must equal the plan's rank count (stages of every VW, plus one parameter server per shard under
WSP); `python -m executor --plan P --cluster C --ranks` prints it. Rank 0 writes the measured report.
"""

from __future__ import annotations

import argparse
import os
import sys

from hetsim.cli.assignments import assignments, model_kwargs
from hetsim.errors import HetsimError

__all__ = ["main", "add_arguments", "options_from_args", "model_kwargs"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plan", required=True, help="plan JSON (or a shipped name)")
    p.add_argument("--cluster", required=True, help="cluster YAML (or a shipped name)")
    p.add_argument("--model", default=None, help="modelzoo model (default: the plan's model)")
    p.add_argument("--model-arg", action="append", default=[], metavar="NAME=INT",
                   help="model constructor argument, e.g. hidden=1024 (repeatable)")
    p.add_argument("--profile", default=None, help="model profile; orders the hetpipe schedule")
    p.add_argument("--waves", type=int, default=6, help="waves of Nm minibatches per VW (default 6)")
    p.add_argument("--warmup-waves", type=int, default=1, help="waves left out of the window (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data", choices=("teacher", "random"), default="teacher",
                   help="teacher: a learnable synthetic task; random: random tensors for throughput")
    p.add_argument("--lr", type=float, default=None,
                   help="learning rate (default: the plan optimizer's, 0.05 for SGD, 1e-3 for Adam)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--slowdown", action="append", default=[], metavar="GPU=FACTOR",
                   help="EMULATED slowdown (busy-wait) of the rank running GPU, e.g. host/gpu1=2 (repeatable)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per rank (default 1)")
    p.add_argument("--device", default="cpu",
                   help="cpu (default), cuda (stage ranks on the host's GPUs, round-robin) or cuda:N (all on GPU N)")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                   help="auto: gloo on CPU; on CUDA nccl when every stage rank has its own GPU, else gloo "
                        "through host memory")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds before a silent peer counts as dead")
    p.add_argument("--out", default=None, metavar="DIR", help="write report.json, CSVs and trace.json here")


def options_from_args(args):
    from executor.options import ExecOptions
    slowdown = assignments(args.slowdown, "--slowdown", float, "GPU=FACTOR, e.g. host/gpu1=2")
    return ExecOptions(waves=args.waves, warmup_waves=args.warmup_waves, seed=args.seed, data=args.data,
                       lr=args.lr, momentum=args.momentum, slowdown=slowdown, threads=args.threads,
                       timeout_s=args.timeout, device=args.device, backend=args.backend)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m executor", description=__doc__.splitlines()[0])
    add_arguments(p)
    p.add_argument("--ranks", action="store_true", help="print the number of ranks the plan needs and exit")
    args = p.parse_args(argv)
    try:
        from executor.launch import (check_fault, layout_of, make_job, one_line, rank_main, report_from_records,
                                     torchrun_error)
        if args.out and os.environ.get("RANK", "0") == "0":
            # Before the run, not after it; by the rank that writes it alone: torchrun starts every rank
            # at once, and the check makes and removes the folder, which concurrent checks trip over.
            from hetsim.cli.arguments import check_output_dir
            from hetsim.report import REPORT_FILES
            check_output_dir(args.out, "--out", names=REPORT_FILES)
        job = make_job(args.plan, args.cluster, args.model, profile=args.profile, options=options_from_args(args),
                       model_kwargs=model_kwargs(args.model_arg))
        layout = layout_of(job)
        check_fault(job, layout)
        if args.ranks:
            print(layout.world_size)
            return 0
        try:
            rank, world = int(os.environ.get("RANK", -1)), int(os.environ.get("WORLD_SIZE", -1))
        except ValueError:
            raise HetsimError(f"RANK={os.environ.get('RANK')!r}, WORLD_SIZE={os.environ.get('WORLD_SIZE')!r}: "
                              "expected whole numbers (torchrun sets them)") from None
        if rank < 0:
            raise HetsimError("not started by torchrun (RANK unset); use torchrun --nproc-per-node "
                              f"{layout.world_size} -m executor ..., or executor.launch() from Python")
        if world != layout.world_size:
            raise HetsimError(f"plan {job.plan.name} needs {layout.world_size} ranks "
                              f"({len(layout.stage_ranks)} stage ranks + {len(layout.ps_ranks)} parameter servers"
                              f"{' + 1 sdpipe group scheduler' if job.plan.sync.mode == 'sdpipe' else ''}); "
                              f"torchrun started {world}")
        try:
            records = rank_main(rank, world, job, "env://", None, on_exit=torchrun_error)
        except HetsimError:
            raise
        except Exception as exc:         # a bug: its one line survives torchrun, which keeps no traceback
            raise HetsimError(f"rank {rank}: {one_line(exc)}") from exc
        if rank == 0:
            from hetsim.cli.simulate import format_report
            report = report_from_records(job, records)
            print(format_report(report))
            if args.out:
                report.write(args.out, drop_figures=True)
        return 0
    except HetsimError as exc:
        print(f"executor: error: {exc}", file=sys.stderr, flush=True)
        from executor.launch import torchrun_error
        torchrun_error(f"executor: error: {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
