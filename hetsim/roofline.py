"""Roofline time of a layer on a GPU type: the slower of its arithmetic and its memory traffic.

    t = max(flops / (peak_flops x compute_efficiency), bytes / (memory_bandwidth x memory_efficiency))

Efficiency factors (achieved / peak) are data: a GPU type's `efficiency` mapping in gpu_profiles/gpus
(keys "compute", "memory", or "compute.<LayerKind>"), else the defaults below, which are assumptions.
`precision` (hetsim.plan.PRECISIONS) picks the peak of the layer kind's kernel class, as in
hetsim.derive: matrix products on tensor cores at tf32/fp16/bf16 where the GPU has them; 16-bit
precisions halve the (FP32-counted) bytes.
"""

from __future__ import annotations

from hetsim.derive import ELEMENT_BYTES, kernel_class
from hetsim.gpu import GpuType

__all__ = ["roofline_s", "efficiency", "DEFAULT_EFFICIENCY"]

DEFAULT_EFFICIENCY = {"compute": 0.5, "memory": 0.7}


def efficiency(gpu: GpuType, resource: str, layer_kind: str = "") -> float:
    table = gpu.efficiency
    return table.get(f"{resource}.{layer_kind}", table.get(resource, DEFAULT_EFFICIENCY[resource]))


def roofline_s(flops: float, bytes_moved: float, gpu: GpuType, *, layer_kind: str = "",
               precision: str = "fp32") -> float:
    peak = gpu.peak_flops(precision, kernel_class(layer_kind))
    compute = flops / (peak * efficiency(gpu, "compute", layer_kind))
    moved = bytes_moved * ELEMENT_BYTES[precision] / 4                # bytes are counted at FP32
    memory = moved / (gpu.memory_bandwidth_Bps * efficiency(gpu, "memory", layer_kind))
    return max(compute, memory)
