"""`hetsim sweep`: simulate a grid of what-ifs on Dask workers; write OUT/sweep.csv and a plot.

    hetsim sweep --plan P --vary nm=2,4,8 --vary network.bandwidth_gbit_s=25,100 --out sweep/
    hetsim sweep ... --scheduler tcp://10.0.0.5:8786        # on a Dask cluster already running
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import sys
from pathlib import Path

from hetsim.cli.arguments import check_output_dir, whole
from hetsim.cli.progress import add_quiet, progress_bar
from hetsim.cli.simulate import (add_input_arguments, load_inputs, parse_slowdowns, parse_straggler,
                                 warmup_waves_of)
from hetsim.errors import HetsimError
from hetsim.outputs import staged, write_text

__all__ = ["add_arguments", "run", "write_csv"]


MAX_POINTS = 10_000     # a grid past this is more often a typo than a plan (10 000 points take hours)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_input_arguments(p)
    p.add_argument("--vary", action="append", default=[], metavar="NAME=V1,V2,...",
                   help="an axis of the grid (repeatable; every combination runs): staleness, nm, waves, jitter, "
                   "seed, network.bandwidth_gbit_s, network.latency_us, slowdown.GPU (GPU: node1/gpu0 or node2)")
    p.add_argument("--out", required=True, metavar="DIR", help="write sweep.csv (and sweep.png) here")
    p.add_argument("--workers", type=whole(1), default=None, metavar="N",
                   help="Dask worker processes on this machine (default: every core; 1: run here, no cluster)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="run on a Dask cluster already running, e.g. tcp://10.0.0.5:8786, instead of a local one "
                   "(its workers need hetsim installed)")
    p.add_argument("--no-plots", action="store_true", help="skip sweep.png")
    p.add_argument("--max-points", type=whole(1), default=MAX_POINTS, metavar="N",
                   help=f"refuse a grid of more points than this (default {MAX_POINTS}), before running any")
    add_quiet(p)


def run(args: argparse.Namespace) -> int:
    from hetsim.fanout import check_address, fan_out
    from hetsim.sweep import SweepBase, check_axes, grid, parse_axes, run_point
    axes = parse_axes(args.vary)
    size = math.prod(len(a.values) for a in axes)
    if size > args.max_points:
        raise HetsimError(f"--vary: {' x '.join(str(len(a.values)) for a in axes)} = {size:,} points, more than "
                          f"--max-points {args.max_points:,}; narrow the axes or raise --max-points")
    if args.scheduler is not None:
        check_address(args.scheduler)
    prob, delay = parse_straggler(args.straggler)
    named = parse_slowdowns(args.slowdown)
    warmup_waves_of(args)              # refuses --warmup-waves >= --waves before any point runs
    check_output_dir(args.out, "--out")
    cluster, profile, plan = load_inputs(args)
    base = SweepBase(cluster=cluster, profile=profile, plan=plan, waves=args.waves,
                     warmup_waves=args.warmup_waves, seed=args.seed, jitter_cv=args.jitter,
                     slowdown=_checked_slowdown(cluster, named), straggler_prob=prob, straggler_delay_s=delay)
    check_axes(axes, base)
    points = grid(axes)
    with progress_bar("sweep", len(points), quiet=args.quiet, unit="point") as bar:
        rows = fan_out(run_point, [(base, p) for p in points], workers=args.workers,
                       scheduler=args.scheduler, bar=bar)
    names = [a.name for a in axes]
    if all(r["error"] for r in rows):
        first = rows[0]
        raise HetsimError(f"--vary: every one of the {len(rows)} points failed, e.g. "
                          f"{', '.join(f'{n}={first[n]}' for n in names)}: {first['error']} (nothing written)")
    with staged(args.out, owns=("sweep.csv", "sweep.png")) as stage:     # the table and its figure together
        written = [write_csv(rows, stage / "sweep.csv")]
        if 1 <= len(names) <= 2 and not args.no_plots:
            from hetsim.plots import plot_sweep
            try:
                written.append(plot_sweep(rows, names, stage / "sweep.png"))
            except (ValueError, OverflowError) as exc:        # axis values matplotlib cannot lay out
                (stage / "sweep.png").unlink(missing_ok=True)    # a half-drawn figure stays out
                print(f"warning: sweep.png not drawn ({exc}); sweep.csv holds every point", file=sys.stderr)
    paths = [Path(args.out) / p.name for p in written]
    print(format_rows(rows, names))
    failed = sum(1 for r in rows if r["error"])
    print(f"\n{len(rows)} point{'s' if len(rows) != 1 else ''}{f', {failed} failed' if failed else ''}; "
          f"wrote {', '.join(str(p) for p in paths)}")
    return 0


def _checked_slowdown(cluster, named: dict[str, float]) -> dict[str, float]:
    """The --slowdown names as given (points may add to them), once proven to name GPUs or nodes."""
    from hetsim.slowdown import gpu_factors
    gpu_factors(cluster, named)
    return named


def write_csv(rows: list[dict], path: Path) -> Path:
    """One row per point; floats as Python writes them (shortest text that reads back exactly)."""
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    write_text(path, text.getvalue())
    return path


def format_rows(rows: list[dict], names: list[str]) -> str:
    """A short table: the axis values, samples/s and the error of each point."""
    cell = lambda v: str(v) if isinstance(v, int) else f"{v:.10g}"    # distinct values stay distinct
    width = [max(len(n), 8, *(len(cell(r[n])) for r in rows)) for n in names]
    lines = ["  ".join(f"{n:>{w}}" for n, w in zip(names, width)) + f"  {'samples/s':>11}"]
    for r in rows:
        cells = "  ".join(f"{cell(r[n]):>{w}}" for n, w in zip(names, width))
        result = f"{r['samples_per_s']:>11.2f}" if not r["error"] else f"  error: {r['error']}"
        lines.append(cells + "  " + result)
    return "\n".join(lines)
