"""Derived layer times for device types nobody measured: a roofline with efficiency factors as data.

A layer pass (forward or backward) that does F FLOPs and moves B bytes takes, on a device with peak
rate P and memory bandwidth W,

    t = max(F / (P x e_compute), B / (W x e_memory)) + overhead_s

with e (achieved / peak) looked up by layer kind and pass, most specific first:
"compute.Conv2d.bwd", "compute.Conv2d", "compute" (same for "memory"); "overhead_s" (per-layer fixed
cost: kernel launches, Python dispatch) likewise. Factors come from a device type's `efficiency`
mapping in gpu_profiles/gpus/*.yaml, else gpu_profiles/efficiency.yaml (`gpus: {type: {...}}`, then
`default`). `calibrate` fits them to a measured profile, per layer kind and pass.
Counts (F, B) come from modelzoo.counting, on the meta device; this module imports no torch.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from hetsim.data import data_root
from hetsim.errors import SpecError
from hetsim.gpu import GpuType
from hetsim.profile import LayerProfile, ModelProfile

__all__ = ["LayerCost", "Efficiency", "load_efficiencies", "pass_time_s", "derive_profile", "calibrate",
           "calibration_errors"]

PASSES = ("fwd", "bwd")


@dataclass(frozen=True, kw_only=True)
class LayerCost:
    """One layer's work for a whole minibatch: FLOPs (multiply-add = 2) and bytes moved, per pass."""

    kind: str
    flops_fwd: float
    flops_bwd: float
    bytes_fwd: float
    bytes_bwd: float

    def flops(self, pass_: str) -> float:
        return self.flops_fwd if pass_ == "fwd" else self.flops_bwd

    def bytes(self, pass_: str) -> float:
        return self.bytes_fwd if pass_ == "fwd" else self.bytes_bwd


@dataclass(frozen=True, kw_only=True)
class Efficiency:
    """Factors for one device type: keys as in the module docstring; `base` is consulted after."""

    factors: dict
    base: "Efficiency | None" = None

    def get(self, key: str, kind: str, pass_: str) -> float:
        for k in (f"{key}.{kind}.{pass_}", f"{key}.{kind}", key):
            if k in self.factors:
                return float(self.factors[k])
        if self.base is not None:
            return self.base.get(key, kind, pass_)
        raise SpecError(f"efficiency: no factor {key!r} (add it to gpu_profiles/efficiency.yaml default)")


def load_efficiencies(gpus: dict[str, GpuType], path: str | Path | None = None) -> dict[str, Efficiency]:
    """The Efficiency of each device type: its own yaml mapping, then efficiency.yaml's entries."""
    path = Path(path) if path is not None else data_root() / "efficiency.yaml"
    doc = yaml.safe_load(path.read_text()) or {}
    if not isinstance(doc.get("default"), dict):
        raise SpecError(f"{path.name}: default: expected a mapping of efficiency factors")
    default = Efficiency(factors=doc["default"])
    per_gpu = doc.get("gpus") or {}
    out = {}
    for name, gpu in gpus.items():
        shared = Efficiency(factors=per_gpu.get(name, {}), base=default)
        out[name] = Efficiency(factors=dict(gpu.efficiency), base=shared)
    return out


def pass_time_s(cost: LayerCost, pass_: str, gpu: GpuType, eff: Efficiency) -> float:
    """Roofline seconds of one pass of one layer (module docstring)."""
    kind = cost.kind
    compute = cost.flops(pass_) / (gpu.peak_fp32_flops * eff.get("compute", kind, pass_))
    memory = cost.bytes(pass_) / (gpu.memory_bandwidth_Bps * eff.get("memory", kind, pass_))
    return max(compute, memory) + eff.get("overhead_s", kind, pass_)


def derive_profile(base: ModelProfile, costs: list[LayerCost], gpus: list[GpuType],
                   effs: dict[str, Efficiency], *, note: str = "") -> ModelProfile:
    """`base` (measured or counted: names, bytes, edges) with derived times added for `gpus` and
    flops_fwd filled in from `costs`."""
    if len(costs) != base.n_layers:
        raise SpecError(f"derive: {len(costs)} layer counts for a {base.n_layers}-layer profile of {base.model}")
    layers = []
    for layer, cost in zip(base.layers, costs):
        fwd = {**layer.fwd_s, **{g.name: pass_time_s(cost, "fwd", g, effs[g.name]) for g in gpus}}
        bwd = {**layer.bwd_s, **{g.name: pass_time_s(cost, "bwd", g, effs[g.name]) for g in gpus}}
        layers.append(replace(layer, fwd_s=fwd, bwd_s=bwd, flops_fwd=cost.flops_fwd))
    derived = ", ".join(g.name for g in gpus)
    source = "; ".join(s for s in (base.source, f"derived for {derived} by hetsim.derive (roofline of "
                                   f"counted FLOPs/bytes with efficiency factors from gpu_profiles){note}") if s)
    return replace(base, layers=tuple(layers), source=source)


def calibrate(measured: list[ModelProfile], costs: list[list[LayerCost]], device: GpuType,
              device_type: str) -> dict[str, float]:
    """Efficiency factors that make the roofline fit `device_type`'s measured times: per layer kind and
    pass, the sum of ideal times (at peak) over the sum of measured times less the per-layer overhead
    (the median time of layers that do no work), so each kind's total time is fitted exactly and large
    layers weigh more than small ones. One factor per kind and pass serves as compute and memory factor."""
    samples = [(c, pass_, _seconds(l, pass_, device_type)) for p, cs in zip(measured, costs)
               for l, c in zip(p.layers, cs) for pass_ in PASSES]
    idle = [t for c, pass_, t in samples if c.flops(pass_) == 0 and c.bytes(pass_) == 0 and t > 0]
    overhead = statistics.median(idle) if idle else 0.0
    sums: dict[str, list[float]] = {}
    for c, pass_, t in samples:
        ideal = _ideal_s(c, pass_, device)
        if ideal > 0:
            acc = sums.setdefault(f"{c.kind}.{pass_}", [0.0, 0.0])
            acc[0] += ideal
            acc[1] += max(t - overhead, 0.0)
    factors: dict[str, float] = {"overhead_s": overhead}
    for key, (ideal, busy) in sorted(sums.items()):
        if busy > 0:
            factors[f"compute.{key}"] = factors[f"memory.{key}"] = ideal / busy
    ideal_all = sum(i for i, _ in sums.values())
    busy_all = sum(b for _, b in sums.values())
    factors["compute"] = factors["memory"] = ideal_all / busy_all if busy_all else 1.0
    return {k: float(f"{v:.4g}") for k, v in factors.items()}


def calibration_errors(measured: ModelProfile, derived: ModelProfile, device_type: str,
                       predicted_type: str) -> dict[str, dict[str, float]]:
    """Per layer kind and pass: median absolute per-layer error and the error of the kind's summed
    time, as fractions of the measurement; key "all" covers the whole model."""
    rows: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for m, d in zip(measured.layers, derived.layers):
        for pass_ in PASSES:
            pair = (_seconds(m, pass_, device_type), _seconds(d, pass_, predicted_type))
            rows.setdefault(m.kind, {}).setdefault(pass_, []).append(pair)
            rows.setdefault("all", {}).setdefault(pass_, []).append(pair)
    out = {}
    for kind, by_pass in rows.items():
        for pass_, pairs in by_pass.items():
            measured_s = sum(a for a, _ in pairs)
            out.setdefault(kind, {})[f"{pass_}_layer_median"] = statistics.median(
                abs(b - a) / a for a, b in pairs if a > 0) if any(a > 0 for a, _ in pairs) else 0.0
            out[kind][f"{pass_}_sum"] = (sum(b for _, b in pairs) - measured_s) / measured_s if measured_s else 0.0
            out[kind][f"{pass_}_share"] = measured_s
    return out


def _ideal_s(c: LayerCost, pass_: str, device: GpuType) -> float:
    return max(c.flops(pass_) / device.peak_fp32_flops, c.bytes(pass_) / device.memory_bandwidth_Bps)


def _seconds(layer: LayerProfile, pass_: str, device_type: str) -> float:
    return (layer.fwd_s if pass_ == "fwd" else layer.bwd_s)[device_type]
