"""How fast the simulator runs: events per second, and wall time as the simulated cluster grows.

    python benchmarks/bench_sim.py                  # prints two tables; asserts nothing
    python benchmarks/bench_sim.py --baseline none  # this tree only
    python benchmarks/bench_sim.py --repeat 3       # fastest of 3 each, on a busy machine

1. The built-in HetPipe case: 16 GPUs (4 nodes x 4), VGG-19, ED plan, 1,000 minibatches per VW.
2. Scaling: the same node types repeated to 16, 256 and 1,024 GPUs, ED virtual workers of four
   GPUs (one per node type), WSP through parameter servers on the first four nodes, a fixed number
   of minibatches per VW; wall time per simulated event should stay flat if cost grows linearly.

Each case also runs with the network model (hetsim/sim/fluid.py) of a baseline commit, in the same
process right beside the current one, so the ratio old / new holds up on a loaded machine; the
reports of both must be byte-identical (the speed-ups change no result), and the table says so.
Only fluid.py is swapped: speed-ups elsewhere (hetsim/sim/world.py's run loop, which collects
garbage less often while it runs) make both columns faster.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import subprocess
import time
import types
from dataclasses import replace
from pathlib import Path

import hetsim
import hetsim.sim.world
from hetsim.cluster import Cluster, Node
from hetsim.plan import Plan, StageSpec, VirtualWorker
from hetsim.sim import SimOptions, run_simulation

# The last commit before issue 17's simulator speed-ups (incremental solves remembered by kind).
BASELINE = "5584b61"


def scaled_cluster(base: Cluster, copies: int) -> Cluster:
    nodes = []
    for c in range(copies):
        for node in base.nodes:
            name = f"{node.name}c{c}"
            gpus = tuple(replace(g, id=f"{name}/gpu{g.index}", node=name) for g in node.gpus)
            nodes.append(Node(name=name, gpus=gpus, intra_link=node.intra_link))
    return replace(base, name=f"{base.name}x{copies}", nodes=tuple(nodes),
                   ps_nodes=tuple(n.name for n in nodes[:len(base.nodes)]))


def scaled_plan(base: Plan, copies: int) -> Plan:
    vws = []
    for c in range(copies):
        for vw in base.virtual_workers:
            stages = tuple(StageSpec(gpu=s.gpu.replace("/", f"c{c}/"), layers=s.layers) for s in vw.stages)
            vws.append(VirtualWorker(name=f"{vw.name}c{c}", stages=stages))
    return replace(base, name=f"{base.name}x{copies}", virtual_workers=tuple(vws))


def baseline_fluid(rev: str) -> types.ModuleType | None:
    """hetsim/sim/fluid.py as of `rev`, loaded as a module (None without git or that commit)."""
    root = Path(__file__).resolve().parents[1]
    try:
        source = subprocess.run(["git", "show", f"{rev}:hetsim/sim/fluid.py"], cwd=root, check=True,
                                capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    module = types.ModuleType(f"fluid_{rev}")
    exec(compile(source, f"{rev}:hetsim/sim/fluid.py", "exec"), module.__dict__)
    return module


@contextlib.contextmanager
def network_model(fluid: types.ModuleType | None):
    """Run simulations with `fluid`'s FluidShare (None: the current one)."""
    current = hetsim.sim.world.FluidShare
    hetsim.sim.world.FluidShare = fluid.FluidShare if fluid is not None else current
    try:
        yield
    finally:
        hetsim.sim.world.FluidShare = current


def timed(cluster, profile, plan, waves, fluid=None):
    gc.collect()            # the previous run's garbage is freed here, not inside this run's time
    with network_model(fluid):
        start = time.perf_counter()
        report = run_simulation(cluster, profile, plan, SimOptions(waves=waves, trace=False))
        wall = time.perf_counter() - start
    return wall, report.settings["events"], report.to_json()


def compared(cluster, profile, plan, waves, old, repeat):
    """(wall, events, old wall or None, identical or None): the baseline and this tree taking turns,
    `repeat` times each, the shortest wall time of each (the run least disturbed by other work)."""
    walls, old_walls, identical = [], [], True
    for _ in range(repeat):
        if old is not None:
            old_wall, _, old_text = timed(cluster, profile, plan, waves, old)
            old_walls.append(old_wall)
        wall, events, text = timed(cluster, profile, plan, waves)
        walls.append(wall)
        identical = identical and (old is None or old_text == text)
    if old is None:
        return min(walls), events, None, None
    return min(walls), events, min(old_walls), identical


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minibatches", type=int, default=100, help="per VW in the scaling series")
    parser.add_argument("--max-gpus", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=1, help="runs of each, taking turns; the fastest counts")
    parser.add_argument("--baseline", default=BASELINE,
                        help=f"commit whose network model runs beside this one (default {BASELINE}; 'none': skip)")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat: must be >= 1, got {args.repeat}")
    old = None if args.baseline == "none" else baseline_fluid(args.baseline)
    if args.baseline != "none" and old is None:
        print(f"(no baseline: git show {args.baseline}:hetsim/sim/fluid.py failed)")
    cluster = hetsim.load_cluster("hetpipe_4node")
    profile = hetsim.load_profile("vgg19_b32_analytic")
    plan = hetsim.load_plan("hetpipe_vgg19_ed")
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"load average (1 / 5 / 15 min) at start: {load}; {os.cpu_count()} CPUs")
    vs = f"{'old s':>9}{'old/new':>8}{'identical':>11}" if old is not None else ""
    if old is not None:
        print(f"old = network model of {args.baseline}; identical = byte-identical reports")

    wall, events, old_wall, same = compared(cluster, profile, plan, 1000 // plan.nm, old, args.repeat)
    print("\n1. HetPipe 16-GPU case, 1,000 minibatches per virtual worker")
    print(f"{'GPUs':>6}{'minibatches':>13}{'events':>11}{'wall s':>9}{'events/s':>12}{'target':>10}{vs}")
    print(f"{16:>6}{4 * 1000:>13,}{events:>11,}{wall:>9.2f}{events / wall:>12,.0f}{'< 1 s':>10}"
          f"{versus(wall, old_wall, same)}")

    print(f"\n2. Scaling, {args.minibatches} minibatches per virtual worker")
    print(f"{'GPUs':>6}{'VWs':>6}{'events':>11}{'wall s':>9}{'events/s':>12}{'us/event':>10}{'wall vs 16':>12}"
          f"{'work vs 16':>12}{'target':>9}{vs}")
    base = None
    for gpus in (16, 256, 1024):
        if gpus > args.max_gpus:
            break
        copies = gpus // 16
        wall, events, old_wall, same = compared(scaled_cluster(cluster, copies), profile,
                                                scaled_plan(plan, copies), max(3, args.minibatches // plan.nm), old,
                                                args.repeat)
        base = base or (wall, events)
        target = "< 20 s" if gpus == 1024 and args.minibatches == 100 else ""
        print(f"{gpus:>6}{4 * copies:>6}{events:>11,}{wall:>9.2f}{events / wall:>12,.0f}"
              f"{1e6 * wall / events:>10.1f}{wall / base[0]:>12.1f}{events / base[1]:>12.1f}{target:>9}"
              f"{versus(wall, old_wall, same)}")
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"\nload average at end: {load}")


def versus(wall: float, old_wall: float | None, identical: bool | None) -> str:
    """The baseline's columns: its wall time, old / new, and whether the reports are identical."""
    if old_wall is None:
        return ""
    return f"{old_wall:>9.2f}{old_wall / wall:>8.2f}{'yes' if identical else 'NO':>11}"


if __name__ == "__main__":
    main()
