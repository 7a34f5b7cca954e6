"""GPU types: datasheet figures, loaded from gpu_profiles/gpus/*.yaml (SI units inside).

Peaks are dense (no structured sparsity). `peak_fp16_tflops` is FP16 with FP32 accumulate: on tensor
cores where the GPU has them (`tensor_cores: true`), else packed FP16 on CUDA cores (Pascal).
`peak_tf32_tflops` and `peak_bf16_tflops` exist from Ampere on; GPUs without them run such work the way
the libraries fall back on them: TF32 GEMMs as FP32 on CUDA cores, BF16 GEMMs with FP32 math.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from hetsim.data import data_root
from hetsim.errors import SpecError
from hetsim.fields import Fields
from hetsim.plan import PRECISIONS
from hetsim.units import GIB, in_units

__all__ = ["GpuType", "load_gpu_type", "load_gpu_types", "shipped_type_names", "gpu_type_document", "KERNEL_CLASSES",
           "MATMUL_CLASSES"]

# What a kernel does, as far as the hardware unit that runs it goes: products with weights (gemm),
# products of activations with each other or a fused attention kernel (attention): both can run on
# tensor cores; pointwise work and reductions (elementwise) and normalisation (norm): CUDA cores.
KERNEL_CLASSES = ("gemm", "attention", "elementwise", "norm")
MATMUL_CLASSES = ("gemm", "attention")
# What an efficiency key may start with (hetsim.roofline, hetsim.derive and gpu_profiles/efficiency.yaml).
EFFICIENCY_FACTORS = ("compute", "memory", "tensor", "overhead_s", "floor_s")

_FIELDS = {"name", "display_name", "architecture", "memory_gib", "memory_bandwidth_GBps",
           "peak_fp32_tflops", "peak_fp16_tflops", "host_link", "sources", "notes", "efficiency",
           "framework_reserve_gib", "peak_tf32_tflops", "peak_bf16_tflops", "tensor_cores"}


@dataclass(frozen=True, kw_only=True)
class GpuType:
    """One GPU model's datasheet figures. `efficiency` holds achieved/peak factors by layer kind."""

    name: str
    display_name: str
    memory_bytes: int
    memory_bandwidth_Bps: float
    peak_fp32_flops: float
    peak_fp16_flops: float
    peak_tf32_flops: float | None = None       # dense TF32 tensor cores (Ampere on)
    peak_bf16_flops: float | None = None       # dense BF16 tensor cores, FP32 accumulate (Ampere on)
    tensor_cores: bool = False                 # peak_fp16_flops is a tensor-core rate (Volta on)
    host_link: str = "pcie3x16"
    architecture: str = ""
    sources: tuple[str, ...] = ()
    efficiency: dict[str, float] = field(default_factory=dict, compare=False, hash=False)
    # Memory a training process holds on this GPU beyond its tensors: CUDA context, cuBLAS/cuDNN
    # workspaces and the caching allocator's fragmentation (hetsim.memory adds it to every stage).
    framework_reserve_bytes: int = 0

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB

    def peak_flops(self, precision: str = "fp32", kernel_class: str = "gemm") -> float:
        """Dense peak FLOP/s of `kernel_class` work trained at `precision` (hetsim.plan.PRECISIONS).
        Matrix products run at the precision's tensor-core rate where this GPU has one, else on CUDA
        cores at FP32 (the faster of FP32 and packed FP16 for fp16); other work runs at FP32."""
        return self._matmul_peak(precision, kernel_class) or self.peak_fp32_flops

    def uses_tensor_cores(self, precision: str, kernel_class: str) -> bool:
        """Whether `kernel_class` work at `precision` runs on tensor cores on this GPU."""
        peak = self._matmul_peak(precision, kernel_class)
        return peak is not None and (precision != "fp16" or self.tensor_cores)

    def _matmul_peak(self, precision: str, kernel_class: str) -> float | None:
        """The peak of matrix products at a 16-bit or TF32 precision; None where FP32 CUDA cores run it."""
        if precision not in PRECISIONS:
            raise SpecError(f"precision: {precision!r} is not one of {', '.join(PRECISIONS)}")
        if kernel_class not in KERNEL_CLASSES:
            raise SpecError(f"kernel class: {kernel_class!r} is not one of {', '.join(KERNEL_CLASSES)}")
        if kernel_class not in MATMUL_CLASSES or precision == "fp32":
            return None
        if precision == "fp16":
            return max(self.peak_fp16_flops, self.peak_fp32_flops)
        return self.peak_tf32_flops if precision == "tf32" else self.peak_bf16_flops


def gpu_type_from_fields(f: Fields) -> GpuType:
    f.reject_unknown(_FIELDS)
    sources = f.list("sources")
    if not sources or not all(isinstance(s, str) for s in sources):
        raise f.error("sources", "cite at least one source for the datasheet figures, as text")
    tensor_cores = f.flag("tensor_cores")
    for key in ("peak_tf32_tflops", "peak_bf16_tflops"):
        if f.has(key) and not tensor_cores:
            raise f.error(key, "a TF32/BF16 tensor-core peak needs `tensor_cores: true` (or remove it)")
    efficiency = f.sub("efficiency", {})
    if isinstance(efficiency, Fields):
        for key in efficiency.data:
            if str(key).split(".")[0] not in EFFICIENCY_FACTORS:
                raise f.error(f"efficiency.{key}", f"unknown factor; a key is one of {', '.join(EFFICIENCY_FACTORS)}, "
                                                   "optionally followed by .<layer kind>[.<pass>]")
        efficiency = {k: efficiency.number(k, positive=True) for k in efficiency.data}
    return GpuType(
        name=f.text("name"),
        display_name=f.text("display_name"),
        architecture=f.text("architecture", ""),
        memory_bytes=int(f.number("memory_gib", positive=True) * GIB),
        memory_bandwidth_Bps=f.number("memory_bandwidth_GBps", positive=True) * 1e9,
        peak_fp32_flops=f.number("peak_fp32_tflops", positive=True) * 1e12,
        peak_fp16_flops=f.number("peak_fp16_tflops", positive=True) * 1e12,
        peak_tf32_flops=_tflops(f, "peak_tf32_tflops"),
        peak_bf16_flops=_tflops(f, "peak_bf16_tflops"),
        tensor_cores=tensor_cores,
        host_link=f.text("host_link", "pcie3x16"),
        sources=tuple(sources),
        efficiency=efficiency,
        framework_reserve_bytes=int(f.number("framework_reserve_gib", 0.0, nonnegative=True) * GIB),
    )


def gpu_type_document(gpu: GpuType) -> dict:
    """The GPU type as a file (or a cluster's inline `gpu_types` entry) that gpu_type_from_fields reads
    back to an equal type, bit for bit (hetsim.units.in_units)."""
    doc = {"name": gpu.name, "display_name": gpu.display_name, "architecture": gpu.architecture,
           "memory_gib": gpu.memory_bytes / GIB, "memory_bandwidth_GBps": in_units(gpu.memory_bandwidth_Bps, 1e9),
           "peak_fp32_tflops": in_units(gpu.peak_fp32_flops, 1e12),
           "peak_fp16_tflops": in_units(gpu.peak_fp16_flops, 1e12)}
    for key, value in (("peak_tf32_tflops", gpu.peak_tf32_flops), ("peak_bf16_tflops", gpu.peak_bf16_flops)):
        if value is not None:
            doc[key] = in_units(value, 1e12)
    doc |= {"tensor_cores": gpu.tensor_cores, "host_link": gpu.host_link}
    if gpu.framework_reserve_bytes:
        doc["framework_reserve_gib"] = gpu.framework_reserve_bytes / GIB
    if gpu.efficiency:
        doc["efficiency"] = dict(gpu.efficiency)
    return doc | {"sources": list(gpu.sources)}


def _tflops(f: Fields, key: str) -> float | None:
    value = f.number(key, None, positive=True)
    return None if value is None else value * 1e12


def load_gpu_type(path: str | Path) -> GpuType:
    return gpu_type_from_fields(Fields.load(path))


def load_gpu_types(folder: str | Path | None = None) -> dict[str, GpuType]:
    """Every GPU type in a folder (default: the shipped gpu_profiles/gpus), keyed by name."""
    folder = Path(folder) if folder is not None else data_root() / "gpus"
    types: dict[str, GpuType] = {}
    for path in sorted(folder.glob("*.yaml")):
        gpu = load_gpu_type(path)
        if gpu.name in types:
            raise SpecError(f"{path.name}: name: {gpu.name!r} is also defined by another file")
        types[gpu.name] = gpu
    return types


@lru_cache(maxsize=1)
def shipped_type_names() -> frozenset[str]:
    """Names of the shipped GPU types (gpu_profiles/gpus): the ones `hetsim profile` can derive times for."""
    return frozenset(load_gpu_types())
