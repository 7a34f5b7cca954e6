"""Fit the GPU roofline's per-kind efficiencies, relative to Conv2d forward, to PipeDream's published
per-layer GPU measurements, and rewrite gpu_profiles/efficiency.yaml's `default` section with them
(its `kernel_classes` section, fitted by experiments/profiles/sailor_layers.py, is kept).

    python -m modelzoo.pipedream_fit [--profiles gpu_profiles/pipedream]

PipeDream's graph.txt files (shipped unchanged in gpu_profiles/pipedream) name neither the GPU nor the batch size.
The batch is read from the Input node's bytes; the GPU is unknown, so only *ratios* are fitted: for
each layer kind and pass, (ideal seconds / measured seconds) over all FIT models, divided by the same
ratio for Conv2d forward. Ideal seconds are the roofline at peak on a nominal reference GPU; the
nominal type cancels out of the ratios except through its FLOP/byte balance (V100's is used). The
absolute level, Conv2d forward efficiency, stays an estimate (CONV_FWD). Errors are reported on
HELD_OUT models as each kind's share of the model's time, derived versus published.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from hetsim.data import data_root, pipedream_profiles
from hetsim.derive import PASSES, Efficiency, LayerCost, pass_time_s
from hetsim.fields import dump_yaml
from hetsim.gpu import load_gpu_types
from hetsim.pipedream_graph import read_graph
from modelzoo.counting import count_model

__all__ = ["FIT", "HELD_OUT", "fit", "main", "write_efficiency"]

FIT = ["vgg16", "resnet50", "densenet121", "squeezenet1_0"]
HELD_OUT = ["alexnet", "resnet18", "resnet101", "resnext50"]
CONV_FWD = 0.65              # estimate: large cuDNN FP32 convolutions reach 60-75% of peak
REFERENCE = "v100"
# PipeDream's kind names -> ours; ours merged for comparison
THEIRS = {"Concat": "Cat", "View": "Flatten"}
OURS = {"AdaptiveAvgPool2d": "AvgPool2d"}
SKIP = {"Input", "Size"}


def _published(path: Path) -> tuple[dict[tuple[str, str], float], int]:
    g = read_graph(path)
    batch = next(l.output_bytes for l in g.layers if l.kind.startswith("Input")) // (3 * 224 * 224 * 4)
    totals: dict[tuple[str, str], float] = {}
    for l in g.layers:
        kind = l.kind.split("(")[0].strip()
        if kind in SKIP:
            continue
        kind = THEIRS.get(kind, kind)
        for pass_ in PASSES:
            t = (l.fwd_s if pass_ == "fwd" else l.bwd_s)["reference"]
            totals[(kind, pass_)] = totals.get((kind, pass_), 0.0) + t
    return totals, batch


def _ideal(costs: list[LayerCost], eff: Efficiency) -> dict[tuple[str, str], float]:
    gpu = load_gpu_types()[REFERENCE]
    totals: dict[tuple[str, str], float] = {}
    for c in costs:
        kind = OURS.get(c.kind, c.kind)
        for pass_ in PASSES:
            key = (kind, pass_)
            totals[key] = totals.get(key, 0.0) + pass_time_s(c, pass_, gpu, eff)
    return totals


def _model(folder: Path, model: str, eff: Efficiency):
    published, batch = _published(folder / f"{model}.txt")
    return published, _ideal(count_model(model, batch), eff), batch


def fit(folder: Path) -> dict[str, float]:
    """Per-kind factors (compute and memory alike), Conv2d forward fixed at CONV_FWD."""
    unit = Efficiency(factors={"compute": 1.0, "memory": 1.0, "overhead_s": 0.0})
    published, ideal = {}, {}
    for model in FIT:
        p, i, _ = _model(folder, model, unit)
        for key in set(p) | set(i):
            published[key] = published.get(key, 0.0) + p.get(key, 0.0)
            ideal[key] = ideal.get(key, 0.0) + i.get(key, 0.0)
    ratio = {k: ideal[k] / published[k] for k in ideal if published.get(k, 0.0) > 0 and ideal[k] > 0}
    scale = CONV_FWD / ratio[("Conv2d", "fwd")]
    factors = {}
    for (kind, pass_), r in sorted(ratio.items()):
        factors[f"compute.{kind}.{pass_}"] = factors[f"memory.{kind}.{pass_}"] = float(f"{r * scale:.3g}")
    return factors


def _shares(totals: dict[tuple[str, str], float]) -> dict[str, float]:
    whole = sum(totals.values())
    out: dict[str, float] = {}
    for (kind, _), t in totals.items():
        out[kind] = out.get(kind, 0.0) + t / whole
    return out


def report(folder: Path, eff: Efficiency) -> str:
    lines = ["| model | set | batch | layer kind | published share | derived share |", "|---|---|---|---|---|---|"]
    for label, models in (("fitted on", FIT), ("held out", HELD_OUT)):
        for model in models:
            published, derived, batch = _model(folder, model, eff)
            theirs, ours = _shares(published), _shares(derived)
            for kind in sorted(theirs, key=lambda k: -theirs[k])[:4]:
                lines.append(f"| {model} | {label} | {batch} | {kind} | {theirs[kind]:.1%} | {ours.get(kind, 0):.1%} |")
    return "\n".join(lines) + "\n"


HEADER = """\
# Achieved / peak factors for the roofline of hetsim.derive, by layer kind and pass (FP32, eager
# PyTorch with cuDNN/cuBLAS). Keys, most specific first: compute.<Kind>.<fwd|bwd>, compute.<Kind>,
# compute (same for memory and overhead_s, the fixed seconds per layer pass: kernel launches;
# tensor.<Kind>[.<pass>] for work on tensor cores, which falls back to the compute keys).
# A GPU type's own `efficiency` mapping in gpu_profiles/gpus/*.yaml, then `gpus: {{type: ...}}` below,
# take precedence over `default` and `kernel_classes`.
#
# `default` is GENERATED by `python -m modelzoo.pipedream_fit`. The per-kind factors are fitted, RELATIVE
# to Conv2d forward, to PipeDream's published per-layer GPU profiles (GPU type not stated there) for
# {fit}. The absolute level (Conv2d forward = {conv}) is an ESTIMATE: no GPU measurement was
# available. The same factors serve every GPU type, so derived times scale with each type's
# datasheet peak rate and bandwidth. See docs/profiles.md for the errors.
#
# `kernel_classes.factors` (merged over `default`) time the parts of transformer blocks by kernel class
# (gemm, attention, elementwise, norm) and the Block's fixed cost; GENERATED by
# `python experiments/profiles/sailor_layers.py --write-factors`, which fits them to real GPU
# measurements: `kernel_classes.source` says on what, experiments/profiles/sailor_layers.md the errors.
#
# `gpus: {{type: {{floor_s.Block.<pass>}}}}`, the least seconds a tensor-parallel rank's block pass takes on
# that type however small its share of the work (the host issuing its kernels and collective calls; no
# floor at TP 1), are GENERATED by `python experiments/profiles/tp_floors.py --write` from Sailor's TP
# layer times (NVLink types only); experiments/profiles/tp_floors.md has the fit and its held-back check.
"""


def write_efficiency(path: str | Path, *, default: dict | None = None, kernel_classes: dict | None = None,
                     gpus: dict | None = None) -> None:
    """Rewrite efficiency.yaml with the given sections replaced and the others kept as they are."""
    path = Path(path)
    doc = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
    doc = {"default": default if default is not None else doc.get("default", {}),
           "kernel_classes": kernel_classes if kernel_classes is not None else doc.get("kernel_classes", {}),
           "gpus": gpus if gpus is not None else doc.get("gpus") or {}}
    path.write_text(HEADER.format(fit=", ".join(FIT), conv=CONV_FWD) + dump_yaml(doc, sort_keys=False, width=100))


BASE = {"compute": 0.5, "memory": 0.7, "overhead_s": 1.0e-05, "compute.Block": 0.6, "overhead_s.Block": 6.0e-05,
        "compute.Embeddings": 0.5, "compute.LayerNorm": 0.5}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", default=str(pipedream_profiles()))
    parser.add_argument("--out", default=str(data_root() / "efficiency.yaml"))
    parser.add_argument("--report", default="experiments/profiles/pipedream_fit.md")
    args = parser.parse_args(argv)
    folder = Path(args.profiles)
    factors = {**BASE, **fit(folder)}
    write_efficiency(args.out, default=factors)
    table = report(folder, Efficiency(factors=factors))
    Path(args.report).parent.mkdir(parents=True, exist_ok=True)
    Path(args.report).write_text("# GPU efficiency factors fitted to PipeDream's published profiles\n\n"
                                 "Each kind's share of the model's fwd+bwd time.\n\n" + table)
    print(table)


if __name__ == "__main__":
    main()
