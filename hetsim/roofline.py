"""Roofline time of a layer on a GPU type: the slower of its arithmetic and its memory traffic.

    t = max(flops / (peak_flops x compute_efficiency), bytes / (memory_bandwidth x memory_efficiency))

Efficiency factors (achieved / peak) are data: a GPU type's `efficiency` mapping in gpu_profiles/gpus
(keys "compute", "memory", or "compute.<LayerKind>"), else the defaults below, which are assumptions.
"""

from __future__ import annotations

from hetsim.gpu import GpuType

__all__ = ["roofline_s", "efficiency", "DEFAULT_EFFICIENCY"]

DEFAULT_EFFICIENCY = {"compute": 0.5, "memory": 0.7}


def efficiency(gpu: GpuType, resource: str, layer_kind: str = "") -> float:
    table = gpu.efficiency
    return table.get(f"{resource}.{layer_kind}", table.get(resource, DEFAULT_EFFICIENCY[resource]))


def roofline_s(flops: float, bytes_moved: float, gpu: GpuType, *, layer_kind: str = "",
               half_precision: bool = False) -> float:
    peak = gpu.peak_fp16_flops if half_precision else gpu.peak_fp32_flops
    compute = flops / (peak * efficiency(gpu, "compute", layer_kind))
    memory = bytes_moved / (gpu.memory_bandwidth_Bps * efficiency(gpu, "memory", layer_kind))
    return max(compute, memory)
