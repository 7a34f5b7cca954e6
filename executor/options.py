"""What an execution runs: how many waves, which data, which optimiser settings, which emulation."""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field

from executor.optimizer import default_lr
from hetsim.errors import HetsimError
from hetsim.schedule.ir import Action

__all__ = ["ExecOptions"]


# A peer silent longer than a day is no peer: larger values overflow the collectives' timedelta.
MAX_TIMEOUT_S = 86_400.0
MAX_SEED = 2**63                # torch.manual_seed's range (as a signed 64-bit integer)


@dataclass(frozen=True, kw_only=True)
class ExecOptions:
    waves: int = 6
    warmup_waves: int = 1
    seed: int = 0
    data: str = "teacher"                  # "teacher" (learnable synthetic task) or "random" (throughput)
    lr: float | None = None                # None: the optimizer's default (executor.optimizer)
    momentum: float = 0.9                  # the plan's optimizer "momentum" (or no optimizer named)
    slowdown: dict[str, float] = field(default_factory=dict)   # gpu id -> emulated factor (>= 1)
    threads: int = 1                       # torch threads per rank
    backend: str = "auto"                  # gloo on CPU; on CUDA nccl with a GPU per rank, else gloo (executor.placement)
    device: str = "cpu"                    # "cpu", "cuda" (a GPU per stage rank, shared round-robin) or "cuda:N"
    timeout_s: float = 60.0                # a peer silent this long is reported dead
    trace: bool = True
    checkpoint_dir: str | None = None     # flush schedules: save every stage's state after each wave
    resume: bool = False                   # start after the last wave every stage has a checkpoint of
    fault: str = ""                        # testing: "RANK:ACTION:die" or "RANK:ACTION:hang", e.g. "1:F3:die"

    def __post_init__(self):
        if not isinstance(self.slowdown, dict) or not isinstance(self.device, str):
            raise HetsimError(f"slowdown must be a mapping of GPU ids to factors and device text, got "
                              f"{self.slowdown!r} and {self.device!r}")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (self.waves, self.warmup_waves)):
            raise HetsimError(f"waves and warmup_waves must be whole numbers, got {self.waves!r} and "
                              f"{self.warmup_waves!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed < MAX_SEED:
            raise HetsimError(f"seed: expected a whole number in [0, 2**63), got {self.seed!r}")
        for name in ("lr", "momentum", "timeout_s"):
            value = getattr(self, name)
            if not (value is None and name == "lr") and (not isinstance(value, (int, float)) or isinstance(value, bool)):
                raise HetsimError(f"{name}: expected a number, got {value!r}")
        for gpu, factor in self.slowdown.items():
            if not isinstance(factor, (int, float)) or isinstance(factor, bool):
                raise HetsimError(f"slowdown[{gpu}]: expected a number, got {factor!r}")
        if self.checkpoint_dir is not None and not isinstance(self.checkpoint_dir, (str, os.PathLike)):
            raise HetsimError(f"checkpoint_dir: expected a folder path, got {self.checkpoint_dir!r}")
        if self.waves < 1:
            raise HetsimError(f"waves: must be >= 1, got {self.waves}")
        if not 0 <= self.warmup_waves < self.waves:
            raise HetsimError(f"warmup_waves: must be in [0, waves), got {self.warmup_waves} with waves={self.waves}")
        if self.data not in ("teacher", "random"):
            raise HetsimError(f"data: unknown mode {self.data!r}; choose teacher or random")
        for gpu, factor in self.slowdown.items():
            if not 1.0 <= factor < math.inf:
                raise HetsimError(f"slowdown[{gpu}]: an emulated slowdown must be finite and >= 1, got {factor}")
        if not ((self.lr is None or 0 < self.lr < math.inf) and 0 <= self.momentum < 1):
            raise HetsimError(f"lr must be finite and > 0 and momentum in [0, 1), got {self.lr} and {self.momentum}")
        self.fault_spec
        if self.resume and not self.checkpoint_dir:
            raise HetsimError("resume: needs checkpoint_dir")
        if self.device != "cpu" and not re.fullmatch(r"cuda(:\d+)?", self.device):
            raise HetsimError(f"device: expected cpu, cuda or cuda:N, got {self.device!r}")
        if self.backend not in ("auto", "gloo", "nccl"):
            raise HetsimError(f"backend: expected auto, gloo or nccl, got {self.backend!r}")
        if self.backend == "nccl" and self.device == "cpu":
            raise HetsimError("backend: nccl moves CUDA tensors only; use device cuda, or backend gloo on cpu")
        if not isinstance(self.threads, int) or self.threads < 1 or not 0 < self.timeout_s <= MAX_TIMEOUT_S:
            raise HetsimError(f"threads must be a whole number >= 1 and timeout_s in (0, {MAX_TIMEOUT_S:g}] "
                              f"seconds, got {self.threads} and {self.timeout_s}")

    def lr_for(self, optimizer: str) -> float:
        """The learning rate: the one given, else the optimizer's default (0.05 for SGD, 1e-3 for Adam)."""
        return default_lr(optimizer) if self.lr is None else self.lr

    @property
    def fault_spec(self) -> tuple[int, str, str] | None:
        if not self.fault:
            return None
        parts = self.fault.split(":")
        if len(parts) != 3 or not parts[0].isdigit() or parts[2] not in ("die", "hang"):
            raise HetsimError(f"fault: expected RANK:ACTION:die|hang, e.g. 1:F3:die, got {self.fault!r}")
        try:
            action = Action.parse(parts[1])
        except ValueError as exc:
            raise HetsimError(f"fault {self.fault!r}: {exc}") from None
        return int(parts[0]), str(action), parts[2]
