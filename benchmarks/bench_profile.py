"""How long profiling takes, and whether per-layer forward times add up to a whole-model forward.

    python benchmarks/bench_profile.py                       # ResNet-152, batch 8, 224x224, this CPU
    python benchmarks/bench_profile.py --model vgg19 --batch 4 --threads 2

Prints one table; asserts nothing. Times taken while other jobs share the CPU are noisy: the load
average is printed beside them.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from modelzoo import build, layer_graph
from modelzoo.counting import counted_profile
from modelzoo.profiler import measure_graph_profile, whole_model_forward_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet152")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None, help="default: torch's (all cores)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, x = build(args.model, batch=args.batch)
    graph = layer_graph(model)
    t0 = time.perf_counter()
    profile = measure_graph_profile(graph, x, model=args.model, repeats=args.repeats, warmup=args.warmup,
                                    progress=True)
    profile_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    counted_profile(args.model, args.batch)
    count_s = time.perf_counter() - t0
    whole_s = whole_model_forward_s(graph, x, repeats=args.repeats, warmup=1)
    layers_s = sum(l.fwd_s["cpu"] for l in profile.layers)
    rows = [
        ("model / batch / layers", f"{args.model} / {args.batch} / {len(graph)}"),
        ("torch threads, load average at end", f"{torch.get_num_threads()}, {os.getloadavg()[0]:.2f}"),
        (f"profile whole model ({args.warmup} warm-up + {args.repeats} passes)", f"{profile_s:.1f} s"),
        ("count FLOPs/bytes on meta (for derived profiles)", f"{count_s:.1f} s"),
        ("sum of per-layer forward medians", f"{layers_s * 1000:.1f} ms"),
        ("whole-model forward, median", f"{whole_s * 1000:.1f} ms"),
        ("ratio layers / whole", f"{layers_s / whole_s:.3f}"),
        ("sum of per-layer backward medians", f"{sum(l.bwd_s['cpu'] for l in profile.layers) * 1000:.1f} ms"),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


if __name__ == "__main__":
    main()
