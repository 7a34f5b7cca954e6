"""How long planning takes: the whole plan search at 16 to 512 GPUs, and the partitioners alone.

    python benchmarks/bench_planner.py                 # search table (issue 17); asserts nothing
    python benchmarks/bench_planner.py --antichain     # partitioner table beside the antichain paper

1. Search (`hetsim plan --policies auto,horovod --nm 1,2,4,8 --staleness 0,4`, the issue's question):
   GPT-2 medium at minibatch 8 (a profile derived for A100 and V100 on the meta device, written to a
   temporary folder) on clusters of 8-GPU nodes, a quarter A100 and the rest V100, NVLink inside nodes
   (300 GB/s), 100 Gbit/s InfiniBand between them, a parameter server on every node: 16 (1 + 1
   nodes), 64 (2 + 6), 128 (4 + 12), 512 (16 + 48). Each cluster is written as YAML and loaded as a
   user's would be. Per size: the default search's time and counts; the exhaustive search
   (`SearchSpace(exhaustive=True)`: simulate every feasible candidate, today's reference) where it
   finishes in reasonable time (--exhaustive-max GPUs), its time, the ratio and whether the best plan
   is the same; up to --verify-max GPUs, a full simulation of the default search's pick beside the
   best full simulation of the top-5 estimates (what `hetsim plan` simulated before), as a ratio.
2. Partitioners (--antichain), per model on 4 and 8 GPUs, median of --repeat runs:
   antichain  augmented-antichain states, their cost tables and PipeDream's DP with replication on
              identical GPUs (hetsim.planner.antichain_partition): the paper's method;
   hetero     the heterogeneous partitioner splitting the layer chain over one virtual worker of that
              many GPUs (hetsim.planner.partition_ordered), memory limits off (1 TiB GPUs).
   Profiles: PipeDream's published graph.txt files of exactly the paper's models, shipped in
   gpu_profiles/pipedream/ (times as profiled, on one GPU type, here "reference"). Paper times: only
   those that ../shared/reference/antichain.md states; the others are "n/g" (not given in the summary
   we hold), not zero.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import hetsim
from hetsim.planner import SearchSpace, search_plans
from hetsim.planner.search import _simulate

from hetsim.cluster import Cluster, GpuSlot, LinkSpec, Node
from hetsim.data import pipedream_profiles
from hetsim.gpu import GpuType
from hetsim.pipedream_graph import read_graph
from hetsim.planner import antichain_partition, partition_ordered
from hetsim.topology import Topology

PROFILES = pipedream_profiles()
MODELS = ["vgg16", "resnet18", "resnet50", "resnet101", "alexnet", "resnext50", "resnext101",
          "inception_v3", "densenet121", "squeezenet1_0"]
# The antichain paper's Table 1 (seconds), as far as ../shared/reference/antichain.md gives it.
PAPER_S = {("vgg16", 4): 0.01, ("resnet101", 4): 1.20, ("resnet101", 8): 3.69,
           ("inception_v3", 4): 3.07, ("inception_v3", 8): 4.12}


def reference_cluster(n_gpus: int, bandwidth_Bps: float) -> Cluster:
    gpu = GpuType(name="reference", display_name="reference", memory_bytes=2**40,
                  memory_bandwidth_Bps=1e12, peak_fp32_flops=1e13, peak_fp16_flops=1e14,
                  sources=("benchmark placeholder: the GPU PipeDream profiled on",))
    link = LinkSpec(kind="ethernet", bandwidth_Bps=bandwidth_Bps, latency_s=0.0)
    slots = tuple(GpuSlot(id=f"node0/gpu{i}", node="node0", index=i, type=gpu) for i in range(n_gpus))
    return Cluster(name=f"reference{n_gpus}", nodes=(Node(name="node0", gpus=slots, intra_link=link),),
                   network=link, ps_nodes=("node0",))


def timed(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


SIZES = {16: (1, 1), 64: (2, 6), 128: (4, 12), 512: (16, 48)}       # GPUs: (A100 nodes, V100 nodes)


def mixed_cluster_yaml(a100_nodes: int, v100_nodes: int) -> str:
    lines = [f"name: mixed{8 * (a100_nodes + v100_nodes)}",
             "network: {kind: infiniband, bandwidth_gbit_s: 100, latency_us: 5}", "nodes:"]
    for i in range(a100_nodes + v100_nodes):
        lines += [f"  - name: node{i}", f"    gpus: [{{type: {'a100' if i < a100_nodes else 'v100'}, count: 8}}]",
                  "    intra_link: {kind: nvlink, bandwidth_GBps: 300, latency_us: 2}"]
    return "\n".join(lines) + "\n"


def gpt2_medium(folder: Path) -> Path:
    """GPT-2 medium at minibatch 8, counted on the meta device and derived for A100 and V100 (needs torch)."""
    out = folder / "gpt2-medium_b8.yaml"
    subprocess.run([sys.executable, "-m", "hetsim", "profile", "--model", "gpt2-medium", "--batch", "8",
                    "--no-measure", "--derive-for", "a100,v100", "--out", str(out), "--no-progress"],
                   check=True, stdout=subprocess.DEVNULL)
    return out


def search_table(sizes: list[int], exhaustive_max: int, verify_max: int) -> None:
    space = SearchSpace(policies=("auto", "horovod"), nm_values=(1, 2, 4, 8), staleness_values=(0, 4), workers=1)
    print(f"plan search, GPT-2 medium (minibatch 8), auto,horovod x Nm 1,2,4,8 x D 0,4; one process; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores\n")
    print("| GPUs | candidates | built | simulated | search s | best (samples/s) | exhaustive s | ratio | "
          "same best | pick vs best of top-5, full simulation |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        profile = hetsim.load_profile(gpt2_medium(Path(tmp)))
        for gpus in sizes:
            path = Path(tmp) / f"mixed{gpus}.yaml"
            path.write_text(mixed_cluster_yaml(*SIZES[gpus]))
            cluster = hetsim.load_cluster(path)
            print(search_row(cluster, profile, space, exhaustive_max, verify_max), flush=True)
    print(f"\nexhaustive: simulate every feasible candidate (SearchSpace(exhaustive=True)), run up to "
          f"{exhaustive_max} GPUs (beyond that it takes minutes to hours); verify: up to {verify_max} GPUs.")


def search_row(cluster, profile, space, exhaustive_max: int, verify_max: int) -> str:
    n = len(cluster.gpus)
    start = time.perf_counter()
    fast = search_plans(cluster, profile, space)
    fast_s = time.perf_counter() - start
    best = fast.best
    row = (f"| {n} | {len(fast.candidates) + fast.pruned} | {len(fast.candidates)} | {fast.simulated} | "
           f"{fast_s:.2f} | {best.policy} Nm{best.nm} D{best.staleness}: {best.predicted_mb_s * profile.batch_size:.1f}"
           f"{'*' if best.simulated_mb_s is not None else '~'} |")
    if n <= exhaustive_max:
        start = time.perf_counter()
        full = search_plans(cluster, profile, dataclasses.replace(space, exhaustive=True))
        full_s = time.perf_counter() - start
        row += f" {full_s:.2f} | {full_s / fast_s:.1f}x | {'yes' if full.best.plan == best.plan else 'NO'} |"
    else:
        row += " capped | - | - |"
    return row + (f" {verify(cluster, profile, space, fast):.3f} |" if n <= verify_max else " not run |")


def verify(cluster, profile, space, fast) -> float:
    """Full simulation of the pick over the best full simulation of the five best estimates."""
    by_estimate = sorted((c for c in fast.candidates if c.feasible),
                         key=lambda c: (-c.estimate.minibatches_per_s, c.staleness, c.nm))[:5]
    rate = lambda c: _simulate((cluster, profile, c.plan, space))
    pick = fast.best.simulated_mb_s or rate(fast.best)
    return pick / max(pick, *(rate(c) for c in by_estimate if c.plan != fast.best.plan))


def antichain_table(repeat: int, bandwidth_gbit: float) -> None:
    bandwidth = bandwidth_gbit * 1e9 / 8
    print(f"planning time, median of {repeat}, seconds; links {bandwidth_gbit:g} Gbit/s\n")
    print("| model | layers | states (family) | antichain 4 GPUs | antichain 8 GPUs | paper 4 GPUs | "
          "paper 8 GPUs | hetero 4 GPUs | hetero 8 GPUs | stages on 8 (replicas) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model in MODELS:
        profile = read_graph(PROFILES / f"{model}.txt")
        row, states, stages = {}, None, ""
        for g in (4, 8):
            row[g], (part, states) = timed(lambda: antichain_partition(
                profile, g, gpu_type="reference", bandwidth_Bps=bandwidth), repeat)
            cluster = reference_cluster(g, bandwidth)
            row["h", g], _ = timed(lambda: partition_ordered(profile, list(cluster.gpus), Topology(cluster),
                                                             nm=1, schedule="1f1b-flush"), repeat)
            stages = "-".join(str(s.replicas) for s in part.stages)
        paper = [f"{PAPER_S[(model, g)]:.2f}" if (model, g) in PAPER_S else "n/g" for g in (4, 8)]
        print(f"| {model} | {profile.n_layers} | {len(states.masks)} ({states.family}) | {row[4]:.3f} | "
              f"{row[8]:.3f} | {paper[0]} | {paper[1]} | {row['h', 4]:.3f} | {row['h', 8]:.3f} | {stages} |")
    print("\nn/g: not given in the summary of the paper we hold (../shared/reference/antichain.md), "
          "which states 0.01-4.12 s over the table and the five entries shown.")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="16,64,128,512", help="cluster sizes in GPUs, from 16, 64, 128, 512")
    parser.add_argument("--exhaustive-max", type=int, default=16,
                        help="run the exhaustive search up to this many GPUs (default 16)")
    parser.add_argument("--verify-max", type=int, default=64,
                        help="fully simulate the pick and the top-5 estimates up to this many GPUs (default 64)")
    parser.add_argument("--antichain", action="store_true", help="the partitioner table instead")
    parser.add_argument("--repeat", type=int, default=5, help="with --antichain: runs per entry")
    parser.add_argument("--bandwidth-gbit", type=float, default=10.0,
                        help="with --antichain: link bandwidth between GPUs in Gbit/s (default 10)")
    args = parser.parse_args(argv)
    if args.antichain:
        antichain_table(args.repeat, args.bandwidth_gbit)
        return
    sizes = [int(x) for x in args.sizes.split(",")]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"--sizes: {unknown[0]} is not one of {', '.join(map(str, SIZES))}")
    search_table(sizes, args.exhaustive_max, args.verify_max)


if __name__ == "__main__":
    main()
