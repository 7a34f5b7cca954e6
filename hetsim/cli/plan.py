"""`hetsim plan`: search allocations, partitions, Nm and D; print the ranking and write the best plan."""

from __future__ import annotations

import argparse
import time

from hetsim.cli.arguments import check_output_file, real, whole
from hetsim.errors import HetsimError
from hetsim.memory import GIB
from hetsim.plan import SCHEDULES

__all__ = ["add_arguments", "run", "format_ranking"]


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
    p.add_argument("--schedule", default="hetpipe", choices=SCHEDULES,
                   help="pipeline schedule of the plans (default %(default)s)")
    p.add_argument("--top", type=whole(1), default=5, metavar="K",
                   help="simulate the K best estimates (and any within --margin of the best; default 5)")
    p.add_argument("--margin", type=real(0, 1), default=0.1,
                   help="also simulate estimates within this fraction of the best (default 0.1)")
    p.add_argument("--waves", type=whole(1), default=12, help="waves per simulation (default 12)")
    p.add_argument("--jitter", type=real(0, 10), default=0.02, metavar="CV",
                   help="lognormal compute jitter in the simulations (default 0.02: without any, "
                   "identical VWs run in lockstep and contend for links at the same instants)")
    p.add_argument("--seed", type=whole(0), default=0, help="seed for the simulations (default 0)")
    p.add_argument("--jobs", type=whole(1), default=None, help="simulation processes (default: every core)")
    p.add_argument("--show", type=whole(0), default=15, metavar="N", help="rows of the ranking to print (default 15)")
    p.add_argument("--out", default=None, metavar="PLAN.json", help="write the best plan here")


def _ints(text: str, option: str, minimum: int) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise HetsimError(f"{option} {text!r}: expected comma-separated integers, e.g. 1,2,4") from None
    if not values:
        raise HetsimError(f"{option}: give at least one value")
    for v in values:
        if v < minimum:
            raise HetsimError(f"{option} {text!r}: every value must be >= {minimum}, got {v}")
    return tuple(sorted(set(values)))


def _policies(text: str) -> tuple[str, ...]:
    from hetsim.planner.search import POLICY_CHOICES
    policies = tuple(p.strip() for p in text.split(",") if p.strip())
    if not policies:
        raise HetsimError("--policies: give at least one policy")
    for p in policies:
        if p not in POLICY_CHOICES:
            raise HetsimError(f"--policies: policy {p!r}: choose from {', '.join(POLICY_CHOICES)}")
    return policies


def _progress(desc: str, total: int):
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit="plan", leave=False, disable=None)


def run(args: argparse.Namespace) -> int:
    import hetsim
    from hetsim.planner import SearchSpace, search_plans
    from hetsim.plan import save_plan
    from hetsim.sim.engine import check_length
    space = SearchSpace(policies=_policies(args.policies), nm_values=_ints(args.nm, "--nm", 1),
                        staleness_values=_ints(args.staleness, "--staleness", 0),
                        schedule=args.schedule, top_k=args.top, margin=args.margin, waves=args.waves,
                        warmup_waves=min(2, args.waves - 1), jitter_cv=args.jitter, seed=args.seed,
                        workers=args.jobs or 0)
    if args.out:
        check_output_file(args.out, "--out")
    cluster = hetsim.load_cluster(args.cluster)
    profile = hetsim.load_profile(args.model, graph_gpu_type=args.graph_gpu, graph_batch_size=args.graph_batch)
    # The longest plan searched: the largest Nm, a stage on every GPU.
    check_length(args.waves, max(space.nm_values), len(cluster.gpus), "--waves and --nm")
    if args.batch is not None:
        profile = profile.scaled_to_batch(args.batch)
    started = time.perf_counter()
    result = search_plans(cluster, profile, space, progress=_progress)
    wall = time.perf_counter() - started
    print(f"plan: {profile.model} (minibatch {profile.batch_size}) on {cluster.name} "
          f"({len(cluster.gpus)} GPUs): {len(result.candidates)} candidates, {result.simulated} simulated, "
          f"{wall:.1f} s\n")
    print(format_ranking(result, cluster, profile.batch_size, args.show))
    if args.out:
        save_plan(result.best.plan, args.out)
        print(f"\nwrote {args.out} (rank 1: {result.best.plan.name}); run it with "
              f"`hetsim simulate --cluster {args.cluster} --profile {args.model} --plan {args.out}`")
    return 0


def format_ranking(result, cluster, batch: int, rows: int = 15) -> str:
    """The ranked table; `*` marks a simulated throughput, `~` a closed-form estimate."""
    header = (f"{'#':>3} {'policy':<18}{'VWs':>4}  {'partition (vw0: GPU type:layers)':<66}{'Nm':>3}{'D':>3}"
              f"{'samples/s':>11}  {'bottleneck':<16}{'peak GiB per GPU (vw0)':<26}{'staleness':<10}")
    lines = [header, "-" * len(header)]
    feasible = [c for c in result.candidates if c.feasible]
    for i, c in enumerate(feasible[:rows], 1):
        vw0 = c.partitions[0]
        partition = " ".join(f"{cluster.gpu(g).type.name}:{lo}-{hi}" for g, (lo, hi) in zip(vw0.gpus, vw0.layers))
        mark = "*" if c.simulated_mb_s is not None else "~"
        memory = "/".join(f"{c.memory_bytes[g] / GIB:.1f}" for g in vw0.gpus)
        stale = f"{c.nm - 1}/{c.staleness + c.plan.sync.offset_for(c.plan.schedule)}" \
            if c.plan.sync.mode == "wsp" else f"{c.nm - 1 if c.plan.schedule in ('1f1b', 'hetpipe') else 0}/-"
        lines.append(f"{i:>3} {c.policy:<18}{len(c.partitions):>4}  {partition:<66}{c.nm:>3}{c.staleness:>3}"
                     f"{c.predicted_mb_s * batch:>10.1f}{mark}  {c.estimate.bottleneck:<16}{memory:<26}{stale:<10}")
    infeasible = [c for c in result.candidates if not c.feasible]
    lines.append("\n* simulated, ~ closed-form estimate; partition: GPU type:first-end layer of each stage "
                 "of vw0; staleness: local (Nm-1) / global bound (D + pull offset)")
    if infeasible:
        lines.append(f"{len(infeasible)} candidate{'s' if len(infeasible) > 1 else ''} cannot run, e.g. {infeasible[0].policy} Nm={infeasible[0].nm}: "
                     f"{infeasible[0].reason}")
    return "\n".join(lines)
