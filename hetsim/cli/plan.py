"""`hetsim plan`: search allocations, partitions, Nm and D; print the ranking and write the best plan."""

from __future__ import annotations

import argparse
import time

from hetsim.cli.arguments import DEFAULT_JITTER, check_output_file, int_list, real, whole
from hetsim.cli.progress import add_quiet, progress_factory
from hetsim.caveats import caveats
from hetsim.errors import HetsimError
from hetsim.memory import GIB
from hetsim.units import MAX_JITTER_CV
from hetsim.window import default_warmup_waves
from hetsim.report_sections import staleness_bounds
from hetsim.plan import ASYNC_SCHEDULES, OPTIMIZERS, PRECISIONS, SCHEDULES
from hetsim.schedule.registry import FLUSH_SCHEDULES, schedule_kind
from hetsim.planner.search import SIM_MAX_GPUS

__all__ = ["add_arguments", "run", "format_ranking", "POLICY_LEGEND"]

# What the policy column's names mean (hetsim.planner.allocation builds them).
POLICY_LEGEND = ("policy: NP one VW per node (NP/k: k per node), ED VW i takes GPU i of every node (ED/v: v VWs), "
                 "HD fast and slow nodes paired and halved, DP one GPU per VW, horovod BSP data parallel on every "
                 "GPU; -NODE...: those nodes left out; +TPt: each stage a tensor-parallel group of t GPUs of one node")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", required=True, help="cluster YAML, or a shipped name")
    p.add_argument("--model", required=True,
                   help="model profile (YAML/JSON, or PipeDream graph.txt), or a shipped name")
    p.add_argument("--batch", type=whole(1), default=None, metavar="B",
                   help="minibatch size (default: the profile's; times scale linearly)")
    p.add_argument("--graph-gpu", default="reference", metavar="TYPE",
                   help="with a PipeDream graph.txt profile: the GPU type its times were measured on")
    p.add_argument("--graph-batch", type=whole(1), default=None, metavar="N",
                   help="with a PipeDream graph.txt profile: the batch size it was measured at")
    p.add_argument("--policies", default="NP,ED,HD",
                   help="comma-separated from NP, ED, HD, auto, horovod (default %(default)s)")
    p.add_argument("--nm", default="1,2,4,8", help="Nm values to try (default %(default)s)")
    p.add_argument("--staleness", default="0", metavar="D,...",
                   help="WSP staleness bounds D to try (default %(default)s)")
    p.add_argument("--tp", default="1", metavar="T,...",
                   help="tensor-parallel degrees to try: each pipeline stage a group of T GPUs of one node "
                   "(default %(default)s; T > 1 runs with --sync bsp, or as a single virtual worker)")
    p.add_argument("--schedule", default=None, choices=SCHEDULES,
                   help="pipeline schedule of the plans (default hetpipe; 1f1b-flush with --sync bsp)")
    p.add_argument("--sync", default="wsp", choices=("wsp", "bsp", "sdpipe"),
                   help="how virtual workers synchronise: WSP parameter servers, BSP all-reduce (Horovod) or "
                   "SDPipe groups (default %(default)s)")
    p.add_argument("--precision", default="fp32", choices=PRECISIONS,
                   help="training precision of the plans: 16-bit halves activations in memory and on links and "
                   "adds FP32 master weights (default %(default)s; layer times are the profile's, so profile "
                   "at the same precision: hetsim profile --precision)")
    p.add_argument("--optimizer", default=None, choices=OPTIMIZERS,
                   help="optimizer whose state each stage keeps: sgd none, momentum one copy of the weights, "
                   "adam/adamw two (default: one FP32 copy, as momentum)")
    p.add_argument("--recompute", action="store_true",
                   help="plans recompute activations: a stage keeps only each layer's input, and each backward "
                   "runs the forward again")
    p.add_argument("--slowdown", action="append", default=[], metavar="GPU=FACTOR",
                   help="plan for a GPU, or every GPU of a node, running slower: node2/gpu1=1.5 or node2=1.5 "
                   "(repeatable)")
    p.add_argument("--top", type=whole(1), default=5, metavar="K",
                   help="simulate the K best estimates (and any within --margin of the best; default 5); "
                   "on clusters of up to --sim-max-gpus GPUs only: larger ones are ranked by the closed-form estimate")
    p.add_argument("--sim-max-gpus", type=whole(0), default=SIM_MAX_GPUS, metavar="N",
                   help=f"simulate candidates only on clusters of at most N GPUs (default {SIM_MAX_GPUS}: simulating "
                   "larger ones takes minutes a candidate)")
    p.add_argument("--margin", type=real(0, 1), default=0.1,
                   help="also simulate estimates within this fraction of the best (default 0.1)")
    p.add_argument("--waves", type=whole(1), default=12, help="waves per simulation (default 12)")
    p.add_argument("--jitter", type=real(0, MAX_JITTER_CV), default=DEFAULT_JITTER, metavar="CV",
                   help="lognormal compute jitter in the simulations (default %(default)s: without any, "
                   "identical VWs run in lockstep and contend for links at the same instants)")
    p.add_argument("--seed", type=whole(0), default=0, help="seed for the simulations (default 0)")
    p.add_argument("--jobs", type=whole(1), default=None,
                   help="Dask worker processes for the simulations (default: every core; 1: in this process)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="simulate on a Dask cluster already running, e.g. tcp://10.0.0.5:8786 (its workers "
                   "need hetsim installed)")
    p.add_argument("--show", type=whole(0), default=15, metavar="N", help="rows of the ranking to print (default 15)")
    p.add_argument("--out", default=None, metavar="PLAN.json", help="write the best plan here")
    p.add_argument("--cost-model", default="hetsim", choices=("hetsim", "pipedream"),
                   help="rank by hetsim's estimate and simulation (default), or by PipeDream's optimizer "
                   "formulas alone (hetsim.planner.pipedream_cost), to compare its choice with ours")
    p.add_argument("--objective", default="throughput", choices=("throughput", "time-to-accuracy"),
                   help="rank the simulated plans by throughput (default), or by predicted time to a target "
                   "loss (hetsim.convergence; needs the model's entry in convergence.yaml)")
    p.add_argument("--target-loss", type=real(0, above=True), default=None, metavar="LOSS",
                   help="with --objective time-to-accuracy: the target (default: the entry's)")
    add_quiet(p)


def _notes(result, cluster, profile, space) -> list[str]:
    """What the ranking leaves out or approximates: search dimensions that built nothing, and the
    caveats of the (GPU type, TP degree) pairs its plans use."""
    groups = {(cluster.gpu(s.gpu).type.name, s.tp) for c in result.candidates if c.plan is not None
              for vw in c.plan.virtual_workers for s in vw.stages}
    skipped = ["; ".join(result.skipped)] if result.skipped else []
    unsimulated = [c for c in result.candidates if c.not_simulated]
    if unsimulated:
        c = unsimulated[0]
        skipped.append(f"{len(unsimulated)} candidate(s) listed by their estimate (~): their simulation had no "
                       f"steady state to time, e.g. {c.policy} Nm {c.nm} D {c.staleness}: {c.not_simulated}")
    if len(cluster.gpus) > space.sim_max_gpus:
        skipped.append(f"no candidate simulated: the cluster's {len(cluster.gpus)} GPUs are more than --sim-max-gpus "
                       f"{space.sim_max_gpus}, so every figure is the closed-form estimate (~), which can read well "
                       "above a simulation; simulate the plan `--out` writes, or raise --sim-max-gpus")
    return skipped + caveats(profile, cluster, groups, space.precision)


def _policies(text: str) -> tuple[str, ...]:
    from hetsim.planner.search import POLICY_CHOICES
    policies = tuple(p.strip() for p in text.split(",") if p.strip())
    if not policies:
        raise HetsimError("--policies: give at least one policy")
    for p in policies:
        if p not in POLICY_CHOICES:
            raise HetsimError(f"--policies: policy {p!r}: choose from {', '.join(POLICY_CHOICES)}")
    return policies


def _schedule(args: argparse.Namespace) -> str:
    """BSP all-reduces after a flush, so it defaults to a flush schedule and refuses an asynchronous one."""
    if args.schedule is None:
        return "1f1b-flush" if args.sync == "bsp" else "hetpipe"
    if args.sync == "bsp" and args.schedule in ASYNC_SCHEDULES:
        raise HetsimError(f"--sync bsp: needs a flush schedule (--schedule {', '.join(FLUSH_SCHEDULES)}), "
                          f"not {args.schedule}")
    kind = schedule_kind(args.schedule)
    if kind.one_gpu_stages and any(t > 1 for t in int_list(args.tp, "--tp", 1)):
        raise HetsimError(f"--tp {args.tp}: --schedule {args.schedule} runs stages of one GPU each; give --tp 1 "
                          "or another schedule")
    modes = kind.sync_modes
    if args.sync not in modes:
        usable = [m for m in modes if m != "none"]
        raise HetsimError(f"--schedule {args.schedule}: runs with --sync {' or '.join(usable)}, not --sync {args.sync}")
    return args.schedule


def _what_if(cluster, profile, items: list[str]):
    """The cluster and profile as the search sees them with --slowdown: slowed GPUs as types of their own."""
    from hetsim.cli.simulate import parse_slowdowns
    from hetsim.slowdown import gpu_factors, slowed_types
    return slowed_types(cluster, profile, gpu_factors(cluster, parse_slowdowns(items)))


def run(args: argparse.Namespace) -> int:
    if args.target_loss is not None and args.objective != "time-to-accuracy":
        raise HetsimError("--target-loss: only with --objective time-to-accuracy")
    if args.objective == "time-to-accuracy" and args.cost_model == "pipedream":
        raise HetsimError("--objective time-to-accuracy: needs simulated candidates (their staleness); "
                          "--cost-model pipedream ranks by its closed form alone")
    import hetsim
    from hetsim.planner import SearchSpace, search_plans
    from hetsim.plan import save_plan
    from hetsim.sim.engine import check_length
    space = SearchSpace(policies=_policies(args.policies), nm_values=int_list(args.nm, "--nm", 1),
                        staleness_values=int_list(args.staleness, "--staleness", 0), tp_values=int_list(args.tp, "--tp", 1),
                        schedule=_schedule(args), sync=args.sync, precision=args.precision,
                        optimizer=args.optimizer, recompute=args.recompute,
                        top_k=args.top if args.cost_model == "hetsim" else 1,
                        margin=args.margin if args.cost_model == "hetsim" else 0.0, waves=args.waves,
                        warmup_waves=default_warmup_waves(args.waves), jitter_cv=args.jitter, seed=args.seed,
                        workers=args.jobs or 0, scheduler=args.scheduler, sim_max_gpus=args.sim_max_gpus)
    if args.out:
        check_output_file(args.out, "--out")
    if args.scheduler is not None:
        from hetsim.fanout import check_address
        check_address(args.scheduler)
    cluster = hetsim.load_cluster(args.cluster)
    profile = hetsim.load_profile(args.model, graph_gpu_type=args.graph_gpu, graph_batch_size=args.graph_batch)
    # The longest plan searched: the largest Nm, a stage on every GPU.
    check_length(args.waves, max(space.nm_values), len(cluster.gpus), "--waves and --nm")
    if args.batch is not None:
        profile = profile.scaled_to_batch(args.batch)
    cluster, profile = _what_if(cluster, profile, args.slowdown)
    started = time.perf_counter()
    result = search_plans(cluster, profile, space, progress=progress_factory(args.quiet, unit="plan"))
    if args.cost_model == "pipedream":
        from hetsim.planner.pipedream_cost import optimum_line, rerank
        result = rerank(result, cluster)
        print(optimum_line(profile, cluster, space.memory.activation_scale))
    accuracy = ""
    if args.objective == "time-to-accuracy":
        from hetsim.convergence import rank_plans
        result, accuracy = rank_plans(result, cluster, profile, space, args.target_loss)
    wall = time.perf_counter() - started
    print(f"plan: {profile.model} (minibatch {profile.batch_size}, {_training(space)}) on {cluster.name} "
          f"({len(cluster.gpus)} GPUs): {len(result.candidates) + result.pruned} candidates "
          f"({result.pruned} below the listed ones by bound, not built), {result.simulated} simulated, "
          f"{wall:.1f} s{_what_if_note(args)}\n")
    print(format_ranking(result, cluster, profile.batch_size, args.show))
    for note in _notes(result, cluster, profile, space):
        print(f"\nnote: {note}")
    if accuracy:
        print("\n" + accuracy)
    if args.out:
        save_plan(result.best.plan, args.out)
        print(f"\nwrote {args.out} (rank 1: {result.best.plan.name}); run it with `{_simulate_command(args)}`")
    return 0


def _simulate_command(args: argparse.Namespace) -> str:
    """The `hetsim simulate` of the written plan with the settings the ranking simulated with, so that
    it reproduces rank 1's figure."""
    import shlex
    words = ["hetsim", "simulate", "--cluster", args.cluster, "--profile", args.model, "--plan", args.out]
    words += ["--graph-gpu", args.graph_gpu] if args.graph_gpu != "reference" else []     # a graph.txt's
    words += ["--graph-batch", str(args.graph_batch)] if args.graph_batch else []
    words += ["--waves", str(args.waves), "--warmup-waves", str(default_warmup_waves(args.waves)), "--jitter", f"{args.jitter:g}",
              "--seed", str(args.seed)]
    words += [w for item in args.slowdown for w in ("--slowdown", item)]
    words += ["--target-loss", f"{args.target_loss:g}"] if args.target_loss is not None else []
    return shlex.join(words)


def _training(space) -> str:
    optimizer = space.optimizer or "one optimizer copy"
    return ", ".join([space.precision, optimizer] + (["recompute"] if space.recompute else []))


def _what_if_note(args: argparse.Namespace) -> str:
    notes = ([f"sync {args.sync}"] if args.sync != "wsp" else []) + [f"slowdown {item}" for item in args.slowdown]
    return f"; what if: {', '.join(notes)}" if notes else ""


def format_ranking(result, cluster, batch: int, rows: int = 15) -> str:
    """The ranked table; `*` marks a simulated throughput, `~` a closed-form estimate. The partition and
    memory columns widen to their longest entry (a VW of many stages), so columns never run together."""
    cells = []
    for c in [c for c in result.candidates if c.feasible][:rows]:
        vw0 = c.partitions[0]
        local, global_ = staleness_bounds(c.plan, c.in_flight)
        cells.append((c, " ".join(f"{cluster.gpu(g).type.name}:{lo}-{hi}" for g, (lo, hi) in zip(vw0.gpus, vw0.layers)),
                      "/".join(f"{c.memory_bytes[g] / GIB:.1f}" for g in vw0.gpus),
                      f"{local}/{'-' if global_ is None else global_}"))
    part_w = max([66] + [len(p) + 1 for _, p, _, _ in cells])
    mem_w = max([26] + [len(m) + 1 for _, _, m, _ in cells])
    header = (f"{'#':>3} {'policy':<18}{'VWs':>4}  {'partition (vw0: GPU type:layers)':<{part_w}}{'Nm':>3}{'D':>3}"
              f"{'samples/s':>11}  {'bottleneck':<16}{'peak GiB per GPU (vw0)':<{mem_w}}{'staleness':<10}")
    lines = [header, "-" * len(header)]
    for i, (c, partition, memory, stale) in enumerate(cells, 1):
        mark = "*" if c.simulated_mb_s is not None else "~"
        lines.append(f"{i:>3} {c.policy:<18}{len(c.partitions):>4}  {partition:<{part_w}}{c.nm:>3}{c.staleness:>3}"
                     f"{c.predicted_mb_s * batch:>10.1f}{mark}  {c.estimate.bottleneck:<16}{memory:<{mem_w}}{stale:<10}")
    infeasible = [c for c in result.candidates if not c.feasible]
    lines.append("\n* simulated, ~ closed-form estimate; partition: GPU type:first-end layer of each stage "
                 "of vw0; staleness: local (in flight - 1) / global bound (D + pull offset)")
    lines.append(POLICY_LEGEND)
    if infeasible:
        lines.append(f"{len(infeasible)} candidate{'s' if len(infeasible) > 1 else ''} cannot run, e.g. {infeasible[0].policy} Nm={infeasible[0].nm}: "
                     f"{infeasible[0].reason}")
    return "\n".join(lines)
