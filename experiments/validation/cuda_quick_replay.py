"""Replay the quick suite's runs on one shared GPU in the simulator, from reconstructed inputs, under
each way of charging a transfer through host memory and any link bandwidth.

    python experiments/validation/cuda_quick_replay.py [--results experiments/results/gpu] [--bandwidths 0.9,1.1,1.3,1.5]

The runs predate `hetsim validate --out`'s inputs/ folder, so the profile they predicted from (timed on
the GPU inside each run) is lost, and this rebuilds one: the one-stage plan's measured time per minibatch spread over the MLP's
layers by their counted work (FLOPs, and bytes at the FP32 ratio of an H200's peak to its bandwidth).
The node is as validate describes it: the ranks share one GPU running one stage at a time, gloo's
latency 300 us. Rows: the two transfer models with the 4 MiB ping-pong bandwidth the runs calibrated
(copies on the shared GPU, as the first run predicted; on the host's cores, as the second), the 32 MiB
hop that experiments/validation/shared_gpu.py measured, and a scan of --bandwidths. Replaying the two
runs' own settings should land near their printed predictions, which checks the reconstruction; the
scan shows which bandwidth, if any, the measurements imply. Measured throughputs are read from the
runs' CSVs. Writes cuda_quick_replay.md into --results.
"""

from __future__ import annotations

import argparse
import csv
import sys
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

import hetsim  # noqa: E402
from executor.validate import host_cluster  # noqa: E402
from modelzoo.counting import counted_profile  # noqa: E402
from suite import CUDA_BATCH, CUDA_MODEL_KWARGS, cases  # noqa: E402

CALIBRATED_BPS = 2.22e9         # the 4 MiB ping-pong as the first run calibrated it (pp2_tp2_gpt/prediction/links.csv)
HOP_32MIB_BPS = 32 * 2**20 / 48.14e-3   # shared_gpu.md: one 32 MiB hop alone
LATENCY_S = 300e-6
FLOP_PER_BYTE = 67e12 / 4.8e12  # H200 FP32 peak over its memory bandwidth


def measured(results: Path) -> dict[str, list[float]]:
    """Plan -> measured samples/s of each run (first run, then the copy_cores run)."""
    out: dict[str, list[float]] = {}
    for path in (results / "validation_cuda_quick.csv", results / "copy_cores" / "validation_cuda_quick.csv"):
        with path.open() as f:
            for row in csv.DictReader(f):
                out.setdefault(row["plan"], []).append(float(row["measured_samples_s"]))
    return out


def profile(seconds_per_minibatch: float):
    prof, costs = counted_profile("mlp", CUDA_BATCH, **CUDA_MODEL_KWARGS)
    work = [(c.flops_fwd + c.bytes_fwd * FLOP_PER_BYTE, c.flops_bwd + c.bytes_bwd * FLOP_PER_BYTE) for c in costs]
    total = sum(f + b for f, b in work)
    layers = tuple(replace(l, fwd_s={"cpu": seconds_per_minibatch * f / total},
                           bwd_s={"cpu": seconds_per_minibatch * b / total}) for l, (f, b) in zip(prof.layers, work))
    return replace(prof, layers=layers, source="reconstructed: one-stage measured time spread by counted work")


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def predict(prof, case, bandwidth: float, copy_cores: int | None) -> float:
    n = len(set(case.plan.gpus))
    cluster = host_cluster(n, 1.0 if n > 1 else None, bandwidth, LATENCY_S, copy_cores=copy_cores)
    report = hetsim.simulate(cluster, prof, case.plan, waves=10, warmup_waves=4, slowdown=case.slowdown or {})
    return report.throughput["samples_per_s"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", type=Path, default=HERE.parents[1] / "experiments" / "results" / "gpu")
    p.add_argument("--bandwidths", default="0.9,1.1,1.3,1.5", help="GB/s to scan with copies on host cores")
    args = p.parse_args(argv)
    runs = measured(args.results)
    quick = [c for c in cases(CUDA_BATCH) if c.quick]
    one_stage = next(c for c in quick if len(set(c.plan.gpus)) == 1)
    prof = profile(CUDA_BATCH / mean(runs[one_stage.plan.name]))
    settings = [("copies on the shared GPU, 2.2 GB/s (the first run's model)", CALIBRATED_BPS, None),
                ("copies on host cores, 2.2 GB/s (the second run's model)", CALIBRATED_BPS, 16),
                (f"copies on host cores, {HOP_32MIB_BPS / 1e9:.2f} GB/s (shared_gpu.py's 32 MiB hop)", HOP_32MIB_BPS, 16),
                *[(f"copies on host cores, {float(b):.2f} GB/s (scan)", float(b) * 1e9, 16)
                  for b in args.bandwidths.split(",")]]
    names = [c.plan.name for c in quick if c is not one_stage]
    lines = ["# The quick suite's shared-GPU runs replayed from reconstructed inputs", "",
             f"`python experiments/validation/cuda_quick_replay.py --bandwidths {args.bandwidths}`. Error of the replayed "
             "prediction against the mean of the two runs' measured samples/s (module docstring: how the inputs are "
             "rebuilt; the one-stage plan is the reconstruction's anchor, so it is not a row).", "",
             "| transfer model | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for label, bandwidth, copy_cores in settings:
        errors = [100 * (predict(prof, c, bandwidth, copy_cores) / mean(runs[c.plan.name]) - 1)
                  for c in quick if c is not one_stage]
        lines.append(f"| {label} | " + " | ".join(f"{e:+.1f} %" for e in errors) + " |")
    text = "\n".join(lines) + "\n"
    (args.results / "cuda_quick_replay.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
