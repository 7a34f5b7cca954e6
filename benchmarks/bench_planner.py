"""How long planning takes, per model, on 4 and 8 GPUs, beside the antichain paper's Table 1.

    python benchmarks/bench_planner.py [--repeat 5] [--bandwidth-gbit 10]   # prints tables; asserts nothing

Profiles: PipeDream's published graph.txt files of exactly the paper's models, read in place from
../shared/reference/pipedream_profiles/ (times as profiled, on one GPU type, here "reference").
Timed per model and GPU count (median of --repeat runs, the profile already loaded):
  antichain  augmented-antichain states, their cost tables and PipeDream's DP with replication on
             identical GPUs (hetsim.planner.antichain_partition): the paper's method;
  hetero     the heterogeneous partitioner splitting the layer chain over one virtual worker of that
             many GPUs (hetsim.planner.partition_ordered), memory limits off (1 TiB GPUs).
Paper times: only those that ../shared/reference/antichain.md states; the others are "n/g" (not
given in the summary we hold), not zero.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from hetsim.cluster import Cluster, GpuSlot, LinkSpec, Node
from hetsim.gpu import GpuType
from hetsim.pipedream_graph import read_graph
from hetsim.planner import antichain_partition, partition_ordered
from hetsim.topology import Topology

PROFILES = Path(__file__).resolve().parents[2] / "shared" / "reference" / "pipedream_profiles"
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--bandwidth-gbit", type=float, default=10.0,
                        help="link bandwidth between GPUs in Gbit/s (default 10)")
    args = parser.parse_args(argv)
    if not PROFILES.is_dir():
        raise SystemExit(f"{PROFILES} is absent: PipeDream's profiles are read in place, not shipped")
    bandwidth = args.bandwidth_gbit * 1e9 / 8
    print(f"planning time, median of {args.repeat}, seconds; links {args.bandwidth_gbit:g} Gbit/s\n")
    print("| model | layers | states (family) | antichain 4 GPUs | antichain 8 GPUs | paper 4 GPUs | "
          "paper 8 GPUs | hetero 4 GPUs | hetero 8 GPUs | stages on 8 (replicas) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model in MODELS:
        profile = read_graph(PROFILES / f"{model}.txt")
        row, states, stages = {}, None, ""
        for g in (4, 8):
            row[g], (part, states) = timed(lambda: antichain_partition(
                profile, g, gpu_type="reference", bandwidth_Bps=bandwidth), args.repeat)
            cluster = reference_cluster(g, bandwidth)
            row["h", g], _ = timed(lambda: partition_ordered(profile, list(cluster.gpus), Topology(cluster),
                                                             nm=1, schedule="1f1b-flush"), args.repeat)
            stages = "-".join(str(s.replicas) for s in part.stages)
        paper = [f"{PAPER_S[(model, g)]:.2f}" if (model, g) in PAPER_S else "n/g" for g in (4, 8)]
        print(f"| {model} | {profile.n_layers} | {len(states.masks)} ({states.family}) | {row[4]:.3f} | "
              f"{row[8]:.3f} | {paper[0]} | {paper[1]} | {row['h', 4]:.3f} | {row['h', 8]:.3f} | {stages} |")
    print("\nn/g: not given in the summary of the paper we hold (../shared/reference/antichain.md), "
          "which states 0.01-4.12 s over the table and the five entries shown.")


if __name__ == "__main__":
    main()
