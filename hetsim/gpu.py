"""GPU types: datasheet figures, loaded from gpu_profiles/gpus/*.yaml (SI units inside)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hetsim.data import data_root
from hetsim.errors import SpecError
from hetsim.fields import Fields

__all__ = ["GpuType", "load_gpu_type", "load_gpu_types"]

GIB = 1024**3

_FIELDS = {"name", "display_name", "architecture", "memory_gib", "memory_bandwidth_GBps",
           "peak_fp32_tflops", "peak_fp16_tflops", "host_link", "sources", "notes", "efficiency",
           "framework_reserve_gib"}


@dataclass(frozen=True, kw_only=True)
class GpuType:
    """One GPU model's datasheet figures. `efficiency` holds achieved/peak factors by layer kind."""

    name: str
    display_name: str
    memory_bytes: int
    memory_bandwidth_Bps: float
    peak_fp32_flops: float
    peak_fp16_flops: float
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


def gpu_type_from_fields(f: Fields) -> GpuType:
    f.reject_unknown(_FIELDS)
    sources = f.list("sources")
    if not sources or not all(isinstance(s, str) for s in sources):
        raise f.error("sources", "cite at least one source for the datasheet figures, as text")
    efficiency = f.sub("efficiency", {})
    if isinstance(efficiency, Fields):
        efficiency = {k: efficiency.number(k, positive=True) for k in efficiency.data}
    return GpuType(
        name=f.text("name"),
        display_name=f.text("display_name"),
        architecture=f.text("architecture", ""),
        memory_bytes=int(f.number("memory_gib", positive=True) * GIB),
        memory_bandwidth_Bps=f.number("memory_bandwidth_GBps", positive=True) * 1e9,
        peak_fp32_flops=f.number("peak_fp32_tflops", positive=True) * 1e12,
        peak_fp16_flops=f.number("peak_fp16_tflops", positive=True) * 1e12,
        host_link=f.text("host_link", "pcie3x16"),
        sources=tuple(sources),
        efficiency=efficiency,
        framework_reserve_bytes=int(f.number("framework_reserve_gib", 0.0, nonnegative=True) * GIB),
    )


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
