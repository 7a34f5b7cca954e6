"""Fit the roofline's efficiency factors to measured profiles and report how well they predict.

    python -m modelzoo.calibration                 # this CPU, 2 threads: measure, fit, write
    python -m modelzoo.calibration --reuse         # refit from the committed measurements only

The device's peak rates are measured here (there is no datasheet for "this CPU, 2 threads"): peak
FLOP/s is the best of a 2048x2048 fp32 matrix product, bandwidth the best of a 256 MiB copy
(read + write). Factors are fitted (hetsim.derive.calibrate) on the FIT models and the errors are
reported for FIT and HELD_OUT models separately, per layer kind. Layer times are the minimum of
the passes (not the median): on a machine shared with other jobs, the minimum is the best estimate
of the uncontended time that the peak rates (also best-of) describe. Writes, under --out
(default experiments/profiles/cpu): device.yaml (peaks + fitted factors, GPU-type format),
measured/<model>_b<batch>.yaml, calibration.md (the error tables).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import yaml

from hetsim.derive import calibrate, calibration_errors, derive_profile, Efficiency
from hetsim.fields import dump_yaml
from hetsim.gpu import load_gpu_type
from hetsim.profile_files import load_profile, save_profile
from modelzoo.counting import count_model
from modelzoo.profiler import measure_profile

__all__ = ["FIT", "HELD_OUT", "measure_cpu_device", "main"]

# (model, batch, kwargs): real input sizes, batches small enough for 2 cores.
FIT = [("vgg16", 4, {}), ("resnet50", 8, {}), ("alexnet", 32, {}),
       ("gpt2-small", 2, {"n_layer": 4, "seq_len": 256})]
HELD_OUT = [("resnet18", 16, {}), ("resnext50", 4, {}), ("densenet121", 4, {}),
            ("inception_v3", 4, {}), ("squeezenet1_0", 16, {}), ("vgg19", 2, {})]
DEVICE_TYPE = "cpu-local"


def measure_cpu_device(threads: int, *, repeats: int = 7) -> dict:
    """Peak FLOP/s and copy bandwidth of this CPU at `threads`, as a GPU-type document."""
    torch.set_num_threads(threads)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    x = torch.randn(64 * 1024 * 1024)
    y = torch.empty_like(x)
    flops = 2 * 2048**3 / _best(lambda: a @ b, repeats)
    bandwidth = 2 * x.numel() * 4 / _best(lambda: y.copy_(x), repeats)
    return {"name": DEVICE_TYPE, "display_name": f"this CPU, {threads} threads",
            "architecture": torch.backends.cpu.get_cpu_capability(), "memory_gib": 24,
            "memory_bandwidth_GBps": round(bandwidth / 1e9, 2), "peak_fp32_tflops": round(flops / 1e12, 4),
            "peak_fp16_tflops": round(flops / 1e12, 4), "host_link": "none",
            "sources": [f"measured by modelzoo.calibration on {time.strftime('%Y-%m-%d')}: best of {repeats} "
                        f"2048^3 fp32 matmuls and 256 MiB copies, torch {torch.__version__}, {threads} threads"]}


def _best(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def _measured(out: Path, reuse: bool, threads: int, repeats: int) -> dict[str, object]:
    profiles = {}
    for model, batch, kwargs in FIT + HELD_OUT:
        path = out / "measured" / f"{model}_b{batch}.yaml"
        if not reuse:
            print(f"measuring {model} at batch {batch} ...", flush=True)
            # Layers alone: the roofline (modelzoo.counting) counts layers, not the loss.
            p = measure_profile(model, batch, device_type=DEVICE_TYPE, threads=threads, repeats=repeats,
                                warmup=1, progress=True, statistic="min", loss=False, **kwargs)
            path.parent.mkdir(parents=True, exist_ok=True)
            save_profile(p, path)
        profiles[model] = load_profile(path)
    return profiles


def _table(rows: list[tuple[str, dict]], title: str) -> str:
    lines = [f"### {title}", "", "| layer kind | share of measured time | fwd: median layer error | "
             "bwd: median layer error | fwd: error of the sum | bwd: error of the sum |", "|---|---|---|---|---|---|"]
    total = sum(r["fwd_share"] + r["bwd_share"] for k, r in rows if k == "all")
    for kind, r in rows:
        share = (r["fwd_share"] + r["bwd_share"]) / total if total else 0.0
        lines.append(f"| {kind} | {share:.1%} | {r['fwd_layer_median']:.0%} | {r['bwd_layer_median']:.0%} | "
                     f"{r['fwd_sum']:+.0%} | {r['bwd_sum']:+.0%} |")
    return "\n".join(lines) + "\n"


def _pooled(errors: list[tuple[object, dict]]) -> list[tuple[str, dict]]:
    """Errors of several models, pooled per kind: recomputed from the summed profiles' layer pairs."""
    merged: dict[str, dict[str, list]] = {}
    for weight, e in errors:
        for kind, r in e.items():
            m = merged.setdefault(kind, {})
            for key, v in r.items():
                m.setdefault(key, []).append((v, r[f"{key[:3]}_share"]))
    out = []
    for kind, m in merged.items():
        row = {}
        for key, vals in m.items():
            if key.endswith("_share"):
                row[key] = sum(v for v, _ in vals)
            else:                                    # share-weighted mean across models
                w = sum(s for _, s in vals)
                row[key] = sum(v * s for v, s in vals) / w if w else 0.0
        out.append((kind, row))
    return sorted(out, key=lambda kr: (kr[0] != "all", -(kr[1]["fwd_share"] + kr[1]["bwd_share"])))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="experiments/profiles/cpu")
    parser.add_argument("--reuse", action="store_true", help="refit from committed measurements")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    device_path = out / "device.yaml"
    if args.reuse:
        doc = yaml.safe_load(device_path.read_text())
    else:
        doc = measure_cpu_device(args.threads)
    profiles = _measured(out, args.reuse, args.threads, args.repeats)
    # Attention counted materialized, as when the shipped CPU factors were fitted; the CPU runs a fused
    # attention kernel too, so counting it fused is the better model but needs a refit.
    costs = {m: count_model(m, b, attention="materialized", **kw) for m, b, kw in FIT + HELD_OUT}
    doc.pop("efficiency", None)
    device_path.write_text(dump_yaml(doc, sort_keys=False))
    device = load_gpu_type(device_path)
    factors = calibrate([profiles[m] for m, _, _ in FIT], [costs[m] for m, _, _ in FIT], device, DEVICE_TYPE)
    device_path.write_text(dump_yaml({**doc, "efficiency": factors}, sort_keys=False))
    device = load_gpu_type(device_path)
    eff = Efficiency(factors=factors)
    report = ["# CPU calibration of hetsim.derive's roofline", "",
              f"Device: {doc['display_name']}: {doc['peak_fp32_tflops'] * 1000:.0f} GFLOP/s, "
              f"{doc['memory_bandwidth_GBps']} GB/s (measured). Errors are (derived - measured) / measured.", ""]
    per_model = ["| model | batch | set | measured fwd+bwd s | derived s | error |", "|---|---|---|---|---|---|"]
    for label, group in (("fitted on", FIT), ("held out", HELD_OUT)):
        errors = []
        for m, b, _ in group:
            derived = derive_profile(profiles[m], costs[m], [device], {DEVICE_TYPE: eff})
            renamed = _as(derived, DEVICE_TYPE)
            e = calibration_errors(profiles[m], renamed, DEVICE_TYPE, "derived")
            errors.append((m, e))
            meas = e["all"]["fwd_share"] + e["all"]["bwd_share"]
            pred = meas + e["all"]["fwd_sum"] * e["all"]["fwd_share"] + e["all"]["bwd_sum"] * e["all"]["bwd_share"]
            per_model.append(f"| {m} | {b} | {label} | {meas:.3f} | {pred:.3f} | {(pred - meas) / meas:+.0%} |")
        report.append(_table(_pooled(errors), f"Per layer kind, models {label} ({', '.join(m for m, _, _ in group)})"))
    report += ["### Per model", "", *per_model, ""]
    (out / "calibration.md").write_text("\n".join(report))
    print("\n".join(report))


def _as(profile, device_type: str):
    """The derived times under the name "derived", so measured and derived sit side by side."""
    from dataclasses import replace
    layers = tuple(replace(l, fwd_s={"derived": l.fwd_s[device_type]}, bwd_s={"derived": l.bwd_s[device_type]})
                   for l in profile.layers)
    return replace(profile, layers=layers)


if __name__ == "__main__":
    main()
