"""Actions and schedules as plain data.

An action is (kind, index, chunk); the chunk is described below the kinds. Kinds:
    F, B                 forward / backward of minibatch `index`
    I, W                 split backward (zero-bubble schedules): input gradient, then weight gradient
    SEND_F, RECV_F       activations of minibatch `index` to the next / from the previous stage
    SEND_B, RECV_B       gradients of minibatch `index` to the previous / from the next stage
    UPDATE               asynchronous schedules: apply minibatch `index`'s update to the local weights
    STEP                 flush schedules: one optimiser step over wave `index`'s accumulated gradients
    PUSH, PULL           WSP: push wave `index`'s aggregated update / pull global weights before wave `index`
    ALLREDUCE            BSP: all-reduce wave `index`'s gradients with the same stage of every VW
    GROUP_SYNC           SDPipe: average weights with the group the stage's scheduler forms after wave `index`
Every action also names the model chunk it works on (0 unless the schedule places several virtual
stages on a device, as interleaved 1F1B does); `Schedule.stages[d]` is device d's one ordered list.
Written as text like torch.distributed.pipelining's IR: "F3", "SEND_B3", "PUSH1", "F3c1" (chunk 1).
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from typing import NamedTuple

__all__ = ["Action", "Schedule", "KINDS", "COMPUTE", "SYNC_KINDS"]

KINDS = ("F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "UPDATE", "STEP",
         "PUSH", "PULL", "ALLREDUCE", "GROUP_SYNC")
COMPUTE = ("F", "B", "I", "W")
SYNC_KINDS = ("PUSH", "PULL", "ALLREDUCE", "GROUP_SYNC")
_TEXT = re.compile(r"^(%s)(\d+)(?:c(\d+))?$" % "|".join(sorted(KINDS, key=len, reverse=True)))


class Action(NamedTuple):
    kind: str
    index: int
    chunk: int = 0

    def __str__(self) -> str:
        return f"{self.kind}{self.index}" + (f"c{self.chunk}" if self.chunk else "")

    @classmethod
    def parse(cls, text: str) -> "Action":
        m = _TEXT.match(text.strip())
        if not m:
            raise ValueError(f"not an action: {text!r} (expected e.g. F3, SEND_B2, PUSH1, F3c1)")
        return cls(m.group(1), int(m.group(2)), int(m.group(3) or 0))


@dataclass(frozen=True)
class Schedule:
    """One virtual worker's schedule: `stages[d]` is device d's action list, in order. With `chunks`
    model chunks per device, chunk c of device d is virtual stage c * n_stages + d (Megatron's layout)."""

    name: str
    nm: int
    n_minibatches: int
    stages: tuple[tuple[Action, ...], ...]
    chunks: int = 1

    @property
    def n_stages(self) -> int:
        """Devices (action lists); the pipeline has n_stages x chunks virtual stages."""
        return len(self.stages)

    @property
    def n_virtual(self) -> int:
        return self.n_stages * self.chunks

    def virtual_stage(self, device: int, chunk: int) -> int:
        return chunk * self.n_stages + device

    @property
    def waves(self) -> int:
        return -(-self.n_minibatches // self.nm)

    def wave_of(self, mb: int) -> int:
        return mb // self.nm

    def in_flight(self, stage: int) -> int:
        """Most minibatch-chunks forwarded but not yet backwarded (B, or W when split) on a device at
        once: what its activation memory must hold."""
        return sum(self.live_at_peak(stage))

    def live_at_peak(self, stage: int) -> tuple[int, ...]:
        """Per chunk, the minibatches a device holds at the moment it holds the most in all."""
        live, peak = [0] * self.chunks, [0] * self.chunks
        for action in self.stages[stage]:
            if action.kind in ("F", "B", "W"):
                live[action.chunk] += 1 if action.kind == "F" else -1
                if sum(live) > sum(peak):
                    peak = list(live)
        return tuple(peak)

    def deferred_at_peak(self, stage: int) -> tuple[int, ...]:
        """Per chunk, the most minibatches whose input gradient has run (I) and weight gradient (W) has
        not, on a device at once: each holds its layers' output gradients for W. Zero outside split
        backwards."""
        deferred, peak = [0] * self.chunks, [0] * self.chunks
        for action in self.stages[stage]:
            if action.kind in ("I", "W"):
                deferred[action.chunk] += 1 if action.kind == "I" else -1
                peak[action.chunk] = max(peak[action.chunk], deferred[action.chunk])
        return tuple(peak)

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
        chunks = 1 + max(a.chunk for actions in stages for a in actions)
        n_mb = sum(1 for a in stages[0] if a.kind == "F") // chunks
        return cls(name=name, nm=nm, n_minibatches=n_mb, stages=stages, chunks=chunks)
