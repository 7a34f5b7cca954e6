"""Where a rank computes and how its tensors cross to other ranks: CPU with gloo, or CUDA.

On CUDA each stage rank computes on GPU (LOCAL_RANK, or its rank under executor.launch) modulo the
GPU count; stage ranks come first, so a host with a GPU per stage rank gives each its own.
- A GPU per rank on the host: activations and gradients go GPU to GPU over NCCL, and BSP's
  all-reduce too, in NCCL groups of stage ranks only. The world's group stays gloo (its barrier and
  gathers, the parameter servers' and scheduler's messages are host tensors), so a CPU-only rank
  never joins an NCCL communicator.
- More ranks than GPUs (every multi-stage plan on a one-GPU machine): NCCL refuses two ranks of
  one communicator on one GPU, so every message goes through host memory over gloo: copied off
  the GPU, sent, copied onto the receiver's GPU (the path of GPUs without peer access).
Parameter servers are CPU processes (as in HetPipe) and SDPipe's group average goes through the
host too, under either backend: their messages are host tensors.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass

import torch

__all__ = ["Placement", "uses_nccl", "placement_for", "gpu_count", "staged"]


def gpu_count() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def uses_nccl(device: str, backend: str, n_stage_ranks: int, n_gpus: int | None = None) -> bool:
    """Whether stage ranks exchange CUDA tensors over NCCL (else host tensors over gloo). The same
    answer on every rank: it depends on the options, the plan and the host's GPU count only."""
    if not device.startswith("cuda"):
        return False
    if backend != "auto":
        return backend == "nccl"
    if ":" in device and n_stage_ranks > 1:        # every rank on the one GPU named
        return False
    per_host = int(os.environ.get("LOCAL_WORLD_SIZE", n_stage_ranks))
    return per_host <= (gpu_count() if n_gpus is None else n_gpus)


@dataclass(frozen=True)
class Placement:
    compute: torch.device          # where the stage's layers, weights and activations live
    wire: torch.device             # where a tensor must be for the process group to move it

    @property
    def cuda(self) -> bool:
        return self.compute.type == "cuda"

    def to_wire(self, t: torch.Tensor) -> torch.Tensor:
        return t if t.device == self.wire else t.to(self.wire)

    def from_wire(self, t: torch.Tensor) -> torch.Tensor:
        return t if t.device == self.compute else t.to(self.compute)

    def empty(self, shape) -> torch.Tensor:
        """A receive buffer."""
        return torch.empty(shape, device=self.wire)

    def synchronize(self) -> None:
        """Wait for the work queued on this rank's stream, so that the wall clock after it covers that
        work. Not the whole device: NCCL's streams hold receives posted ahead, which complete only
        after this rank's later sends."""
        if self.cuda:
            torch.cuda.current_stream(self.compute).synchronize()

    def peak_memory_bytes(self) -> int:
        """Peak bytes this rank allocated on its GPU; on CPU the process's peak resident set."""
        if self.cuda:
            return int(torch.cuda.max_memory_allocated(self.compute))
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    def describe(self) -> str:
        return str(self.compute) if self.wire == self.compute else f"{self.compute} (via {self.wire})"


CPU = Placement(torch.device("cpu"), torch.device("cpu"))


def staged(device: str) -> Placement:
    """A process computing on `device` whose messages go through the host (calibration probes)."""
    return CPU if device == "cpu" else Placement(torch.device(device), torch.device("cpu"))


def placement_for(device: str, rank: int, nccl: bool) -> Placement:
    """The placement of stage rank `rank`; parameter servers and the scheduler use CPU."""
    if not device.startswith("cuda"):
        return CPU
    if ":" in device:
        gpu = torch.device(device)
    else:
        gpu = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % gpu_count())
    torch.cuda.set_device(gpu)
    return Placement(gpu, gpu if nccl else torch.device("cpu"))
