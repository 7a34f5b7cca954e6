"""Derived layer times for device types nobody measured: a roofline with efficiency factors as data.

A layer pass (forward or backward) that does F FLOPs and moves B bytes takes, on a device with peak
rate P and memory bandwidth W,

    t = max(max(F / (P x e_compute), B / (W x e_memory)) + overhead_s, floor_s)

with e (achieved / peak) looked up by layer kind and pass, most specific first:
"compute.Conv2d.bwd", "compute.Conv2d", "compute" (same for "memory"); "overhead_s" (per-layer fixed
cost: kernel launches, Python dispatch) likewise. "floor_s.<Kind>[.<pass>]" (no generic key, 0 where
absent) is the least a tensor-parallel rank's pass takes however little work it holds: the host issues
the pass's kernels and its collectives' calls no faster than that, and a small enough share waits on
the host rather than the GPU. It applies to TP ranks only (`tp` > 1): a pass on one GPU makes no
collective calls, and Sailor's measured TP-1 blocks run below the TP floors. Factors come from a
device type's `efficiency` mapping in gpu_profiles/gpus/*.yaml, else gpu_profiles/efficiency.yaml
(`gpus: {type: {...}}`, then `default` and `kernel_classes.factors`). `calibrate` fits them to a
measured profile, per layer kind and pass.
Counts (F, B) come from modelzoo.counting, on the meta device; this module imports no torch.

Kernel classes. A layer whose cost has `parts` (a transformer block: its GEMMs, its attention products,
its pointwise work and its norms, counted per operation) takes the sum of one such roofline per part,
each part's kind being its class ("gemm", "attention", "elementwise", "norm"), plus the layer's
overhead once. Other layers are one part whose class follows from their kind (KIND_CLASS).

Precision (hetsim.plan.PRECISIONS) sets P and the bytes per element. Counted FLOPs are matrix products
only (modelzoo.counting), so they run at GpuType.peak_flops(precision, class):
    fp32  FP32 math on CUDA cores, TF32 off (torch.backends.cuda.matmul.allow_tf32 = False);
    tf32  FP32 storage, matrix products in TF32 on tensor cores (allow_tf32 = True, as NVIDIA's NGC
          PyTorch containers set by default); GPUs before Ampere run them in FP32 on CUDA cores;
    fp16, bf16  mixed precision: activations, weight copies and matrix products in 16 bit on tensor
          cores (FP32 accumulate), FP32 master weights in the optimizer step (not a layer time).
Tensor-core work takes its compute factor from "tensor.<kind>[.<pass>]" where the data has one, else
the "compute" chain above. Counted bytes are FP32 (4 per element); 16-bit precisions move 2 per element
in every class: Megatron-style mixed precision keeps norm and softmax inputs and outputs in 16 bit.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from hetsim.data import data_root
from hetsim.errors import SpecError
from hetsim.fields import read_document
from hetsim.gpu import KERNEL_CLASSES, GpuType
from hetsim.plan import ELEMENT_BYTES, PRECISIONS
from hetsim.profile import LayerProfile, ModelProfile, tp_key

__all__ = ["LayerCost", "Efficiency", "load_efficiencies", "pass_time_s", "derive_profile", "with_tp_times",
           "tp_share", "floorless", "bf16_note", "calibrate", "calibration_errors", "kernel_class", "cost_from_ops",
           "KIND_CLASS", "OP_CLASS", "ELEMENT_BYTES"]

PASSES = ("fwd", "bwd")
# Layer kinds -> kernel class; unlisted kinds are elementwise. A Block without parts is timed as one
# GEMM-class roofline: all its counted FLOPs are matrix products.
KIND_CLASS = {**{c: c for c in KERNEL_CLASSES},
              **dict.fromkeys(("Linear", "Conv1d", "Conv2d", "Conv3d", "Head", "Block"), "gemm"),
              **dict.fromkeys(("LayerNorm", "RMSNorm", "Norm", "BatchNorm1d", "BatchNorm2d", "GroupNorm"), "norm")}
# aten operations -> kernel class, for counting a layer's work by class; unlisted operations are
# elementwise (softmax included: outside a fused attention kernel it is a memory-bound pass), or gemm
# if they do counted FLOPs.
OP_CLASS = {**dict.fromkeys(("mm", "addmm", "convolution", "_convolution", "convolution_backward"), "gemm"),
            **dict.fromkeys(("bmm", "baddbmm", "_scaled_dot_product_flash_attention",
                             "_scaled_dot_product_flash_attention_backward",
                             "_scaled_dot_product_efficient_attention",
                             "_scaled_dot_product_efficient_attention_backward",
                             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward",
                             "_flash_attention_forward", "_flash_attention_backward",
                             "_efficient_attention_forward", "_efficient_attention_backward"), "attention"),
            **dict.fromkeys(("native_layer_norm", "native_layer_norm_backward", "native_batch_norm",
                             "_native_batch_norm_legit", "native_batch_norm_backward", "native_group_norm",
                             "native_group_norm_backward", "_fused_rms_norm", "_fused_rms_norm_backward"), "norm")}


@dataclass(frozen=True, kw_only=True)
class LayerCost:
    """One layer's work for a whole minibatch: FLOPs (multiply-add = 2) and bytes moved, per pass.
    `parts`, when counted, split the same work by kernel class (each part's kind is a class)."""

    kind: str
    flops_fwd: float
    flops_bwd: float
    bytes_fwd: float
    bytes_bwd: float
    parts: tuple["LayerCost", ...] = ()

    def flops(self, pass_: str) -> float:
        return self.flops_fwd if pass_ == "fwd" else self.flops_bwd

    def bytes(self, pass_: str) -> float:
        return self.bytes_fwd if pass_ == "fwd" else self.bytes_bwd


def kernel_class(kind: str) -> str:
    return KIND_CLASS.get(kind, "elementwise")


def cost_from_ops(kind: str, fwd: dict[str, tuple[float, float]], bwd: dict[str, tuple[float, float]]) -> LayerCost:
    """A layer's cost with parts by kernel class, from (FLOPs, bytes) per aten operation name and pass."""
    sums = {c: [0.0, 0.0, 0.0, 0.0] for c in KERNEL_CLASSES}
    for offset, ops in ((0, fwd), (1, bwd)):
        for op, (flops, moved) in ops.items():
            acc = sums[OP_CLASS.get(op, "gemm" if flops else "elementwise")]
            acc[offset] += flops
            acc[2 + offset] += moved
    parts = tuple(LayerCost(kind=c, flops_fwd=f, flops_bwd=fb, bytes_fwd=b, bytes_bwd=bb)
                  for c, (f, fb, b, bb) in sums.items() if f or fb or b or bb)
    return LayerCost(kind=kind, flops_fwd=sum(p.flops_fwd for p in parts), flops_bwd=sum(p.flops_bwd for p in parts),
                     bytes_fwd=sum(p.bytes_fwd for p in parts), bytes_bwd=sum(p.bytes_bwd for p in parts), parts=parts)


@dataclass(frozen=True, kw_only=True)
class Efficiency:
    """Factors for one device type: keys as in the module docstring; `base` is consulted after."""

    factors: dict
    base: "Efficiency | None" = None

    def get(self, key: str, kind: str, pass_: str) -> float:
        value = self.find(key, kind, pass_)
        if value is None:
            raise SpecError(f"efficiency: no factor {key!r} (add it to gpu_profiles/efficiency.yaml default)")
        return value

    def find(self, key: str, kind: str, pass_: str, *, generic: bool = True) -> float | None:
        """The most specific factor, or None; `generic=False` skips the bare `key`."""
        for k in (f"{key}.{kind}.{pass_}", f"{key}.{kind}", key)[:3 if generic else 2]:
            if k in self.factors:
                return float(self.factors[k])
        return self.base.find(key, kind, pass_, generic=generic) if self.base is not None else None


def load_efficiencies(gpus: dict[str, GpuType], path: str | Path | None = None) -> dict[str, Efficiency]:
    """The Efficiency of each device type: its own yaml mapping, then efficiency.yaml's entries."""
    path = Path(path) if path is not None else data_root() / "efficiency.yaml"
    doc = read_document(path) or {}
    default, classes = doc.get("default"), doc.get("kernel_classes") or {}
    classes = (classes.get("factors") or {}) if isinstance(classes, dict) else classes
    for section, value in (("default", default), ("kernel_classes.factors", classes)):
        if not isinstance(value, dict):
            raise SpecError(f"{path.name}: {section}: expected a mapping of efficiency factors")
    default = Efficiency(factors={**default, **classes})
    per_gpu = doc.get("gpus") or {}
    out = {}
    for name, gpu in gpus.items():
        shared = Efficiency(factors=per_gpu.get(name, {}), base=default)
        out[name] = Efficiency(factors=dict(gpu.efficiency), base=shared)
    return out


def pass_time_s(cost: LayerCost, pass_: str, gpu: GpuType, eff: Efficiency, precision: str = "fp32",
                tp: int = 1) -> float:
    """Roofline seconds of one pass of one layer (module docstring): one roofline per part, summed;
    `cost` is one rank's share when `tp` > 1, and the pass then takes at least the TP floor."""
    busy = sum(_roofline_s(part, pass_, gpu, eff, precision) for part in (cost.parts or (cost,)))
    floor = (eff.find("floor_s", cost.kind, pass_, generic=False) or 0.0) if tp > 1 else 0.0
    return max(busy + eff.get("overhead_s", cost.kind, pass_), floor)


def _roofline_s(cost: LayerCost, pass_: str, gpu: GpuType, eff: Efficiency, precision: str) -> float:
    kind, cls = cost.kind, kernel_class(cost.kind)
    e_compute = eff.find("tensor", kind, pass_, generic=False) if gpu.uses_tensor_cores(precision, cls) else None
    if e_compute is None:
        e_compute = eff.get("compute", kind, pass_)
    compute = cost.flops(pass_) / (gpu.peak_flops(precision, cls) * e_compute)
    moved = cost.bytes(pass_) * ELEMENT_BYTES[precision] / 4
    return max(compute, moved / (gpu.memory_bandwidth_Bps * eff.get("memory", kind, pass_)))


def bf16_note(gpus: list[GpuType], precision: str) -> str | None:
    """A note naming the GPU types that have no BF16 units, where times are derived at bf16: their matrix
    products are derived at the FP32 peak, though frameworks emulate BF16 there, often more slowly."""
    names = sorted(g.name for g in gpus if precision == "bf16" and g.peak_bf16_flops is None)
    if not names:
        return None
    return (f"bf16: {', '.join(names)} {'has' if len(names) == 1 else 'have'} no BF16 units (before Ampere); their "
            "times are derived at the FP32 peak, which BF16 emulated there may not reach: measure them, or plan "
            "them at fp16")


def derive_profile(base: ModelProfile, costs: list[LayerCost], gpus: list[GpuType],
                   effs: dict[str, Efficiency], *, note: str = "", precision: str = "fp32",
                   tp: int = 1) -> ModelProfile:
    """`base` (measured or counted: names, bytes, edges) with derived times added for `gpus` trained at
    `precision` and flops_fwd filled in from `costs` (one tensor-parallel rank's shares when `tp` > 1)."""
    if len(costs) != base.n_layers:
        raise SpecError(f"derive: {len(costs)} layer counts for a {base.n_layers}-layer profile of {base.model}")
    if precision not in PRECISIONS:
        raise SpecError(f"derive: precision {precision!r} is not one of {', '.join(PRECISIONS)}")
    layers = []
    for layer, cost in zip(base.layers, costs):
        fwd = {**layer.fwd_s, **{g.name: pass_time_s(cost, "fwd", g, effs[g.name], precision, tp) for g in gpus}}
        bwd = {**layer.bwd_s, **{g.name: pass_time_s(cost, "bwd", g, effs[g.name], precision, tp) for g in gpus}}
        layers.append(replace(layer, fwd_s=fwd, bwd_s=bwd, flops_fwd=cost.flops_fwd))
    derived = ", ".join(g.name for g in gpus) + ("" if precision == "fp32" else f" at {precision}")
    source = "; ".join(s for s in (base.source, f"derived for {derived} by hetsim.derive (roofline of "
                                   f"counted FLOPs/bytes with efficiency factors from gpu_profiles){note}") if s)
    return replace(base, layers=tuple(layers), source=source, precision=precision)


def with_tp_times(profile: ModelProfile, costs: list[LayerCost], gpus: list[GpuType],
                  effs: dict[str, Efficiency], tp_degrees, *, precision: str = "fp32") -> ModelProfile:
    """`profile` with times keyed TYPE@tpT added for each tensor-parallel degree T > 1 in `tp_degrees`:
    one rank's share of each layer (`tp_share`) derived as `derive_profile` does, so each pass takes at
    least the type's TP floor where it has one (`floorless` names those without). The all-reduces are
    left to the simulator (tp_times_include_allreduce)."""
    degrees = sorted(set(tp_degrees) - {1})
    if not degrees:
        return profile
    if profile.tp_times_include_allreduce and any("@" in k for k in profile.time_keys):
        raise SpecError(f"derive: profile {profile.model} has measured TP times, all-reduces inside; derived ones "
                        "beside them would leave the simulator to add theirs")
    out = profile
    for t in degrees:
        shard = derive_profile(profile, [tp_share(c, t) for c in costs], gpus, effs, precision=precision, tp=t)
        layers = [replace(l, fwd_s={**l.fwd_s, **{tp_key(g.name, t): d.fwd_s[g.name] for g in gpus}},
                          bwd_s={**l.bwd_s, **{tp_key(g.name, t): d.bwd_s[g.name] for g in gpus}})
                  for l, d in zip(out.layers, shard.layers)]
        out = replace(out, layers=tuple(layers))
    floored = sorted(set(g.name for g in gpus) - set(floorless(gpus, effs)))
    note = (f"; times at TP {', '.join(map(str, degrees))} are one rank's share"
            + (f", a block pass at least the TP host floor of {', '.join(floored)}" if floored else ""))
    return replace(out, tp_times_include_allreduce=False, source=out.source + note)


def floorless(gpus: list[GpuType], effs: dict[str, Efficiency]) -> list[str]:
    """The types among `gpus` with no TP host floor for a block pass (none was fitted: no measurement)."""
    return sorted(g.name for g in gpus if not effs[g.name].find("floor_s", "Block", "fwd", generic=False))


def tp_share(cost: LayerCost, t: int) -> LayerCost:
    """One rank's share of a layer's work in a tensor-parallel group of `t` (Megatron splits heads, the
    MLP width and the vocabulary): norms whole, everything else 1/t. The layer's fixed cost is its
    overhead, which derive charges every rank whole."""
    def part(c: LayerCost) -> LayerCost:
        if kernel_class(c.kind) == "norm":
            return c
        return replace(c, flops_fwd=c.flops_fwd / t, flops_bwd=c.flops_bwd / t, bytes_fwd=c.bytes_fwd / t,
                       bytes_bwd=c.bytes_bwd / t)
    if not cost.parts:
        return part(cost)
    parts = tuple(part(c) for c in cost.parts)
    return replace(cost, parts=parts, **{f: sum(getattr(c, f) for c in parts)
                                         for f in ("flops_fwd", "flops_bwd", "bytes_fwd", "bytes_bwd")})


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
