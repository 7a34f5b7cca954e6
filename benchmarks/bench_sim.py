"""How fast the simulator runs: events per second, and wall time as the simulated cluster grows.

    python benchmarks/bench_sim.py            # prints two tables; asserts nothing

1. The built-in HetPipe case: 16 GPUs (4 nodes x 4), VGG-19, ED plan, 1,000 minibatches per VW.
2. Scaling: the same node types repeated to 16, 256 and 1,024 GPUs, ED virtual workers of four
   GPUs (one per node type), WSP through parameter servers on the first four nodes, a fixed number
   of minibatches per VW; wall time per simulated event should stay flat if cost grows linearly.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import hetsim
from hetsim.cluster import Cluster, Node
from hetsim.plan import Plan, StageSpec, VirtualWorker
from hetsim.sim import SimOptions, run_simulation


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


def timed(cluster, profile, plan, waves):
    start = time.perf_counter()
    report = run_simulation(cluster, profile, plan, SimOptions(waves=waves, trace=False))
    wall = time.perf_counter() - start
    return wall, report.settings["events"], report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minibatches", type=int, default=100, help="per VW in the scaling series")
    parser.add_argument("--max-gpus", type=int, default=1024)
    args = parser.parse_args()
    cluster = hetsim.load_cluster("hetpipe_4node")
    profile = hetsim.load_profile("vgg19_b32_analytic")
    plan = hetsim.load_plan("hetpipe_vgg19_ed")

    wall, events, report = timed(cluster, profile, plan, 1000 // plan.nm)
    print("1. HetPipe 16-GPU case, 1,000 minibatches per virtual worker")
    print(f"{'GPUs':>6}{'minibatches':>13}{'events':>11}{'wall s':>9}{'events/s':>12}{'target':>10}")
    print(f"{16:>6}{4 * 1000:>13,}{events:>11,}{wall:>9.2f}{events / wall:>12,.0f}{'< 2 s':>10}")

    print(f"\n2. Scaling, {args.minibatches} minibatches per virtual worker")
    print(f"{'GPUs':>6}{'VWs':>6}{'events':>11}{'wall s':>9}{'events/s':>12}{'us/event':>10}{'wall vs 16':>12}"
          f"{'work vs 16':>12}")
    base = None
    for gpus in (16, 256, 1024):
        if gpus > args.max_gpus:
            break
        copies = gpus // 16
        wall, events, _ = timed(scaled_cluster(cluster, copies), profile, scaled_plan(plan, copies),
                                max(3, args.minibatches // plan.nm))
        base = base or (wall, events)
        print(f"{gpus:>6}{4 * copies:>6}{events:>11,}{wall:>9.2f}{events / wall:>12,.0f}"
              f"{1e6 * wall / events:>10.1f}{wall / base[0]:>12.1f}{events / base[1]:>12.1f}")


if __name__ == "__main__":
    main()
