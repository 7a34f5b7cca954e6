"""Actions and schedules as plain data.

An action is (kind, index). Kinds:
    F, B                 forward / backward of minibatch `index`
    SEND_F, RECV_F       activations of minibatch `index` to the next / from the previous stage
    SEND_B, RECV_B       gradients of minibatch `index` to the previous / from the next stage
    UPDATE               asynchronous schedules: apply minibatch `index`'s update to the local weights
    STEP                 flush schedules: one optimiser step over wave `index`'s accumulated gradients
    PUSH, PULL           WSP: push wave `index`'s aggregated update / pull global weights before wave `index`
    ALLREDUCE            BSP: all-reduce wave `index`'s gradients with the same stage of every VW
    GROUP_SYNC           SDPipe: average weights with the group the stage's scheduler forms after wave `index`
Written as text like torch.distributed.pipelining's IR: "F3", "SEND_B3", "PUSH1".
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["Action", "Schedule", "KINDS", "COMPUTE", "SYNC_KINDS"]

KINDS = ("F", "B", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "UPDATE", "STEP",
         "PUSH", "PULL", "ALLREDUCE", "GROUP_SYNC")
COMPUTE = ("F", "B")
SYNC_KINDS = ("PUSH", "PULL", "ALLREDUCE", "GROUP_SYNC")
_TEXT = re.compile(r"^(%s)(\d+)$" % "|".join(sorted(KINDS, key=len, reverse=True)))


class Action(NamedTuple):
    kind: str
    index: int

    def __str__(self) -> str:
        return f"{self.kind}{self.index}"

    @classmethod
    def parse(cls, text: str) -> "Action":
        m = _TEXT.match(text.strip())
        if not m:
            raise ValueError(f"not an action: {text!r} (expected e.g. F3, SEND_B2, PUSH1)")
        return cls(m.group(1), int(m.group(2)))


@dataclass(frozen=True)
class Schedule:
    """One virtual worker's schedule: `stages[s]` is stage s's action list, in order."""

    name: str
    nm: int
    n_minibatches: int
    stages: tuple[tuple[Action, ...], ...]

    @property
    def n_stages(self) -> int:
        return len(self.stages)

    @property
    def waves(self) -> int:
        return -(-self.n_minibatches // self.nm)

    def wave_of(self, mb: int) -> int:
        return mb // self.nm

    def in_flight(self, stage: int) -> int:
        """Most minibatches forwarded but not yet backwarded on a stage: what its memory must hold."""
        peak = live = 0
        for kind, _ in self.stages[stage]:
            if kind == "F":
                live += 1
                peak = max(peak, live)
            elif kind == "B":
                live -= 1
        return peak

    def to_csv(self) -> str:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["stage", "step", "action"])
        for s, actions in enumerate(self.stages):
            for i, action in enumerate(actions):
                writer.writerow([s, i, str(action)])
        return out.getvalue()

    @classmethod
    def from_csv(cls, text: str, *, name: str, nm: int) -> "Schedule":
        rows: dict[int, list[tuple[int, Action]]] = {}
        for row in csv.DictReader(io.StringIO(text)):
            rows.setdefault(int(row["stage"]), []).append((int(row["step"]), Action.parse(row["action"])))
        stages = tuple(tuple(a for _, a in sorted(rows[s])) for s in sorted(rows))
        n_mb = sum(1 for a in stages[0] if a.kind == "F")
        return cls(name=name, nm=nm, n_minibatches=n_mb, stages=stages)
