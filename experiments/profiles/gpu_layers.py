"""Derived layer times against layer times measured on a real GPU, at each training precision.

    python experiments/profiles/gpu_layers.py --profiles experiments/results/gpu/profiles --gpu h200

The measured profiles are what experiments/validation/gpu_check.sh writes (`hetsim profile --device cuda
--precision P`, files named MODEL_bBATCH_PRECISION.yaml). For each one this derives the same model,
batch and precision for GPU type --gpu exactly as `hetsim profile --no-measure --derive-for GPU` does
(counted on the meta device, blocks split by kernel class, hetsim.derive with the shipped efficiency
factors), with attention counted both fused and materialized (modelzoo.attention), and tabulates
derived / measured per pass for the embedding, the mean transformer block, the
last layer (with the loss) and the whole model. Nothing here is fitted: the factors were fitted to
Sailor's GPUs at tf32 (gpu_profiles/efficiency.yaml says which), and the tensor-core factor is an
estimate, so a measured GPU that Sailor did not run, or a precision Sailor did not run, is a held-back
check of both. Writes gpu_layers.md beside the profiles unless --out names another file.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

from hetsim.derive import PASSES
from hetsim.gpu import load_gpu_types
from hetsim.profile import ModelProfile
from hetsim.profile_files import load_profile
from modelzoo.attention import ATTENTION
from modelzoo.counting import counted_profile
from modelzoo.profile_command import derive_times

NAME = re.compile(r"(?P<model>.+)_b(?P<batch>\d+)_(?P<precision>fp32|tf32|fp16|bf16)$")


def derived(model: str, batch: int, precision: str, gpu: str, attention: str) -> ModelProfile:
    """What `hetsim profile --no-measure --derive-for GPU --precision P --attention A` writes."""
    skeleton, costs = counted_profile(model, batch, attention=attention)
    return derive_times(model, batch, skeleton, costs, [load_gpu_types()[gpu]], precision=precision,
                        attention=attention)


def parts(profile: ModelProfile, key: str) -> dict[str, dict[str, float]]:
    """Seconds per pass of the first layer, the mean Block, the last layer and the whole model."""
    layers = profile.layers
    blocks = [l for l in layers if l.kind == "Block"]
    times = {p: [getattr(l, f"{p}_s")[key] for l in layers] for p in PASSES}
    out = {"first layer": {p: times[p][0] for p in PASSES}, "last layer (with loss)": {p: times[p][-1] for p in PASSES},
           "whole model": {p: sum(times[p]) for p in PASSES}}
    if blocks:
        out["mean block"] = {p: statistics.mean(getattr(l, f"{p}_s")[key] for l in blocks) for p in PASSES}
    return out


def rows(profiles: Path, gpu: str) -> list[dict]:
    found = []
    for path in sorted(profiles.glob("*.yaml")):
        match = NAME.match(path.stem)
        if not match:
            continue
        measured = load_profile(path)
        if len(measured.gpu_types) != 1:
            raise SystemExit(f"{path}: expected one measured device's times, found {sorted(measured.gpu_types)}")
        precision, key = match["precision"], next(iter(measured.gpu_types))
        if f"{precision}," not in measured.source:
            raise SystemExit(f"{path}: its source does not say it was measured at {precision}: {measured.source}")
        guesses = {a: parts(derived(measured.model, measured.batch_size, precision, gpu, a), gpu) for a in ATTENTION}
        for part, times in parts(measured, key).items():
            found.append({"model": measured.model, "precision": precision, "batch": measured.batch_size, "part": part, "device": key,
                          **{f"measured_{p}": times[p] for p in PASSES},
                          **{f"{a}_{p}": guesses[a][part][p] for a in ATTENTION for p in PASSES}})
    order = {"fp32": 0, "tf32": 1, "fp16": 2, "bf16": 3}
    return sorted(found, key=lambda r: (r["model"], order[r["precision"]], r["batch"]))


def ratio(row: dict, attention: str) -> float:
    """Derived (attention counted so) over measured seconds of a row's forward + backward."""
    return sum(row[f"{attention}_{p}"] for p in PASSES) / sum(row[f"measured_{p}"] for p in PASSES)


def report(found: list[dict], gpu: str, source: str) -> str:
    lines = [f"# Derived {gpu} layer times against measured ones", "",
             f"Measured: {source}.", "",
             f"Derived: `hetsim profile --no-measure --derive-for {gpu} --precision P --attention A`, with the shipped "
             "efficiency factors (nothing fitted to these measurements), attention counted fused (one kernel, as "
             "PyTorch ran it here) and materialized (the s x s scores through memory, as the factors were fitted). "
             "Ratios are derived / measured.", "",
             "| model | precision | micro-batch | part | pass | measured ms | fused ms | ratio | materialized ms | ratio |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in found:
        for p in PASSES:
            m = r[f"measured_{p}"]
            lines.append(f"| {r['model']} | {r['precision']} | {r['batch']} | {r['part']} | {p} | {1e3 * m:.3f} | "
                         + " | ".join(f"{1e3 * r[f'{a}_{p}']:.3f} | {r[f'{a}_{p}'] / m:.2f}" for a in ATTENTION) + " |")
    lines += ["", "Whole model, forward + backward, derived / measured:", "",
              "| model | precision | micro-batch | " + " | ".join(ATTENTION) + " |", "|---|---|---|---|---|"]
    whole = [r for r in found if r["part"] == "whole model"]
    for r in whole:
        lines.append(f"| {r['model']} | {r['precision']} | {r['batch']} | "
                     + " | ".join(f"{ratio(r, a):.2f}" for a in ATTENTION) + " |")
    lines += ["", "Mean |derived / measured - 1| over those rows: "
              + ", ".join(f"{a} {100 * statistics.mean(abs(ratio(r, a) - 1) for r in whole):.0f} %" for a in ATTENTION)
              + "."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profiles", type=Path, required=True, help="folder of MODEL_bBATCH_PRECISION.yaml profiles")
    p.add_argument("--gpu", required=True, help="the GPU type (gpu_profiles/gpus) they were measured on")
    p.add_argument("--out", type=Path, default=None, help="report (default: gpu_layers.md in --profiles)")
    args = p.parse_args(argv)
    if args.gpu not in load_gpu_types():
        raise SystemExit(f"--gpu: unknown GPU type {args.gpu!r}")
    found = rows(args.profiles, args.gpu)
    if not found:
        raise SystemExit(f"--profiles: no MODEL_bBATCH_PRECISION.yaml profiles in {args.profiles}")
    files = [f for f in sorted(args.profiles.glob("*.yaml")) if NAME.match(f.stem)]
    text = report(found, args.gpu, load_profile(files[0]).source.split(" (")[0] + f" ({len(files)} profiles)")
    out = args.out or args.profiles / "gpu_layers.md"
    out.write_text(text)
    print(text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
