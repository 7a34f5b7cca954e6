"""`hetsim simulate`: run the simulator on a cluster, a profile and a plan; print and write the report."""

from __future__ import annotations

import argparse
import math
import sys
import time

from hetsim.data import DEFAULT_CLUSTER, DEFAULT_PLAN, DEFAULT_PROFILE, resolve
from hetsim.cli.arguments import DEFAULT_JITTER, check_output_dir, real, whole
from hetsim.cli.assignments import assignments
from hetsim.cli.progress import add_quiet, still_running
from hetsim.errors import HetsimError, PlanError
from hetsim.outputs import staged
from hetsim.report import REPORT_FIGURES, REPORT_FILES, Report
from hetsim.slowdown import gpu_factors
from hetsim.units import GIB, MAX_JITTER_CV
from hetsim.window import default_warmup_waves

__all__ = ["add_arguments", "add_input_arguments", "run", "format_report", "load_inputs", "parse_slowdowns",
           "parse_straggler", "warmup_waves_of", "in_plan_file"]

# Stage-minibatches from which a run takes a couple of seconds or more: show that it is working.
LONG_RUN = 20_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_input_arguments(p)
    p.add_argument("--out", default=None, metavar="DIR",
                   help="write report.json, CSV tables, trace.json and PNG figures here")
    p.add_argument("--no-plots", action="store_true", help="with --out, skip the PNG figures")
    p.add_argument("--json", action="store_true", help="print the report JSON (and nothing else) on stdout")
    p.add_argument("--target-loss", type=real(0, above=True), default=None, metavar="LOSS",
                   help="predict the time to this loss (default: the model's entry in convergence.yaml, "
                   "if it has one; hetsim.convergence)")
    add_quiet(p)


def add_input_arguments(p: argparse.ArgumentParser) -> None:
    """What a simulation runs and how: the inputs and options `simulate` and `sweep` share."""
    p.add_argument("--cluster", default=DEFAULT_CLUSTER, help="cluster YAML, or a shipped name (default %(default)s)")
    p.add_argument("--profile", default=DEFAULT_PROFILE,
                   help="model profile (YAML/JSON, or PipeDream graph.txt), or a shipped name (default %(default)s)")
    p.add_argument("--graph-gpu", default="reference", metavar="TYPE",
                   help="with a PipeDream graph.txt profile: the GPU type its times were measured on")
    p.add_argument("--graph-batch", type=whole(1), default=None, metavar="N",
                   help="with a PipeDream graph.txt profile: the batch size it was measured at")
    p.add_argument("--plan", default=DEFAULT_PLAN, help="plan JSON, or a shipped name (default %(default)s)")
    p.add_argument("--waves", type=whole(1), default=20, help="waves of Nm minibatches per virtual worker (default 20)")
    p.add_argument("--warmup-waves", type=whole(0), default=None,
                   help="waves left out of the steady-state window (default 2, or waves - 1 if fewer)")
    p.add_argument("--seed", type=whole(0), default=0, help="seed for jitter and stragglers (default 0)")
    p.add_argument("--jitter", type=real(0, MAX_JITTER_CV), default=DEFAULT_JITTER, metavar="CV",
                   help="lognormal compute jitter, coefficient of variation (default %(default)s, as hetsim plan: "
                   "with none, identical virtual workers run in lockstep and meet on every link at once)")
    p.add_argument("--slowdown", action="append", default=[], metavar="GPU=FACTOR",
                   help="make a GPU, or every GPU of a node, slower: node2/gpu1=1.5 or node2=1.5 (repeatable)")
    p.add_argument("--straggler", default=None, metavar="PROB:SECONDS",
                   help="SDPipe-style stragglers: each forward sleeps SECONDS with probability PROB")


def _factor(text: str) -> float:
    value = float(text)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(text)
    return value


def parse_slowdowns(items: list[str]) -> dict[str, float]:
    """{GPU id or node name: factor}; which GPUs a name means is known once the cluster is loaded."""
    return assignments(items, "--slowdown", _factor,
                       "GPU=FACTOR (or NODE=FACTOR) with a finite FACTOR > 0, e.g. node2/gpu1=1.5")


def parse_straggler(text: str | None) -> tuple[float, float]:
    if text is None:
        return 0.0, 0.0
    prob, _, delay = text.partition(":")
    try:
        prob_f, delay_s = float(prob), float(delay)
    except ValueError:
        prob_f = delay_s = math.nan             # refused just below, with the same message
    if not (0 <= prob_f <= 1 and 0 <= delay_s < math.inf):
        raise HetsimError(f"--straggler {text!r}: expected PROB:SECONDS, PROB in [0, 1] and SECONDS >= 0, "
                          "e.g. 0.1:0.1")
    return prob_f, delay_s


def warmup_waves_of(args: argparse.Namespace) -> int:
    if args.warmup_waves is None:
        return default_warmup_waves(args.waves)
    if args.warmup_waves >= args.waves:
        raise HetsimError(f"--warmup-waves {args.warmup_waves}: must be less than --waves ({args.waves}), "
                          "so that some waves are measured")
    return args.warmup_waves


def run(args: argparse.Namespace) -> int:
    import hetsim
    prob, delay = parse_straggler(args.straggler)
    named, warmup = parse_slowdowns(args.slowdown), warmup_waves_of(args)
    if args.out:
        check_output_dir(args.out, "--out")
    started = time.perf_counter()
    cluster, profile, plan = load_inputs(args)
    slowdown = gpu_factors(cluster, named)
    work = args.waves * plan.nm * sum(len(vw.stages) for vw in plan.virtual_workers)
    try:
        with still_running(f"simulating {work:,} stage-minibatches", quiet=args.quiet or work < LONG_RUN):
            report = hetsim.simulate(cluster, profile, plan, waves=args.waves, warmup_waves=warmup, seed=args.seed,
                                     jitter_cv=args.jitter, slowdown=slowdown, straggler_prob=prob,
                                     straggler_delay_s=delay, trace=args.out is not None)
    except PlanError as exc:
        raise in_plan_file(exc, args.plan) from None
    from hetsim.convergence import attach_time_to_accuracy
    attach_time_to_accuracy(report, args.target_loss, param_bytes=profile.param_bytes)
    wall = time.perf_counter() - started
    if args.json:
        print(report.to_json(), end="")
    else:
        print(format_report(report))
        print(f"\nsimulated {report.settings['events']:,} events in {wall:.2f} s")
    if args.out:
        # The report and its figures together, or none; an earlier run's files it does not rewrite go.
        with staged(args.out, owns=REPORT_FILES + REPORT_FIGURES) as stage:
            paths = report.write(stage)
            if not args.no_plots:
                from hetsim.plots import plot_report     # matplotlib loads only when figures are drawn
                paths += plot_report(report, stage)
        print(f"wrote {len(paths)} files to {args.out}/ ({', '.join(p.name for p in paths)})",
              file=sys.stderr if args.json else sys.stdout)
    return 0


def load_inputs(args: argparse.Namespace):
    """Cluster, profile and plan, checked against each other and the options before simulating."""
    import hetsim
    from hetsim.sim.engine import check_length
    cluster = hetsim.load_cluster(args.cluster)
    profile = hetsim.load_profile(args.profile, graph_gpu_type=args.graph_gpu, graph_batch_size=args.graph_batch)
    plan = hetsim.load_plan(args.plan)
    if plan.model and plan.model != profile.model:
        raise in_plan_file(PlanError(f"model: {plan.model!r}, but the profile {args.profile} is of "
                                      f"{profile.model!r}; simulate a plan with a profile of its model"), args.plan)
    check_length(args.waves, plan.nm, sum(len(vw.stages) for vw in plan.virtual_workers),
                 f"--waves and {resolve('plan', args.plan).name}'s nm")
    return cluster, profile, plan


def in_plan_file(exc: PlanError, plan: str) -> PlanError:
    """A plan that does not fit this cluster and profile: the error names its file where it said 'plan'."""
    return PlanError(f"{resolve('plan', plan).name}: {str(exc).removeprefix('plan: ')}")


def format_report(report: Report) -> str:
    """The human-readable summary: headline, per virtual worker, per GPU, staleness, busiest links."""
    plan = report.plan
    t = report.throughput
    lines = [
        f"{report.kind}: plan {plan['name']} ({plan['schedule']}, Nm={plan['nm']}, sync {plan['sync']['mode']}"
        f"{', D=' + str(plan['sync']['staleness_bound']) if plan['sync']['mode'] == 'wsp' else ''}) "
        f"on {report.cluster}, model {report.model}, minibatch {plan['minibatch_size']}",
        f"throughput: {_rate(t['samples_per_s'])} samples/s"
        f"{_tokens(t)} ({_rate(t['minibatches_per_s'], 3)} minibatches/s), {_iteration(t)} "
        f"over a {_window_s(report.window['duration_s'])} s steady-state window",
        "",
        f"{'virtual worker':<16}{'minibatches/s':>14}{'samples/s':>11}{'sync wait s':>12}",
    ]
    for v in report.virtual_workers:
        lines.append(f"{v.name:<16}{v.minibatches_per_s:>14.3f}{v.samples_per_s:>11.1f}{v.sync_wait_s:>12.2f}")
    lines += ["", f"{'gpu':<13}{'type':<14}{'vw':<6}{'stage':>5}{'layers':>9}{'busy':>7}{'memory GiB':>15}"
              f"{'recv wait s':>12}{'sync wait s':>12}"]
    for g in report.gpus:
        mem = f"{g.memory_bytes / GIB:.2f}/{g.memory_capacity_bytes / GIB:.0f}"
        mem = mem if g.tp == 1 else f"tp{g.tp} {mem}"
        lines.append(f"{g.id:<13}{g.type:<14}{g.vw:<6}{g.stage:>5}{f'{g.layers[0]}-{g.layers[1]}':>9}"
                     f"{g.busy_fraction:>7.0%}{mem:>15}{g.recv_wait_s:>12.2f}{g.sync_wait_s:>12.2f}")
    lines += ["", _staleness_line(report)]
    if report.sync.get("mode") == "sdpipe" and "group_size" in report.sync:
        lines.append(_sdpipe_line(report.sync))
    busiest = sorted(report.links, key=lambda l: -l.utilisation)[:4]
    if busiest:     # a measurement records no link utilisation
        lines.append("busiest links: " + ", ".join(f"{l.id} {l.utilisation:.0%}" for l in busiest))
    if report.time_to_accuracy:
        from hetsim.convergence import format_time_to_accuracy
        lines.append(format_time_to_accuracy(report.time_to_accuracy))
    lines += [f"note: {n}" for n in report.notes]
    return "\n".join(lines)


def _rate(value: float, decimals: int = 1) -> str:
    """A rate with `decimals` places, or three significant digits where those would show 0.0 (a
    what-if of a crawling link or GPU still reads as a number, not as nothing)."""
    return f"{value:.{decimals}f}" if value == 0 or abs(value) >= 10 ** -decimals else f"{value:.3g}"


def _tokens(t: dict) -> str:
    return f", {t['tokens_per_s']:,.0f} tokens/s" if "tokens_per_s" in t else ""


def _window_s(seconds: float) -> str:
    # Hundredths, as usual; a window of microseconds or of ages (a link of 1e-300 GB/s) in e-notation.
    return f"{seconds:.2f}" if 0.01 <= seconds < 1e6 else f"{seconds:.3g}"


def _iteration(t: dict) -> str:
    # Older measurement reports carry no iteration time.
    return f"{t['iteration_s']:.4g} s per wave (iteration)" if "iteration_s" in t else ""


def _staleness_line(report: Report) -> str:
    s = report.staleness
    text = f"local staleness: max {s['local']['max']} (bound {s['local_bound']})"
    if "global" in s:
        text += (f"; global staleness: max {s['global']['max']} clocks, mean {s['global']['mean']:.2f} "
                 f"(bound D + pull_offset = {s['global_bound']}); max clock gap {report.sync['max_clock_gap']}")
    return text


def _sdpipe_line(sync: dict) -> str:
    sizes = sync["group_size"]
    histogram = ", ".join(f"size {size}: {n}" for size, n in sorted(sizes["histogram"].items(), key=lambda i: int(i[0])))
    return (f"sdpipe groups (period {sync['period']}): {sync['groups']} formed, mean size {sizes['mean']:.2f} "
            f"({histogram}); all pipelines connected {', '.join(map(str, sync['connections']))} times per stage")
