"""Plans: virtual workers, their stages (GPU + layer range), Nm, the schedule and the sync mode.

A plan is pure data that round-trips to JSON; `check_plan` validates it against a cluster and a
profile (GPUs exist, layers covered, memory fits) and is the only place those rules live.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hetsim.data import resolve
from hetsim.errors import PlanError
from hetsim.fields import Fields

__all__ = ["StageSpec", "VirtualWorker", "SyncSpec", "Plan", "load_plan", "save_plan",
           "SCHEDULES", "SYNC_MODES", "ASYNC_SCHEDULES"]

SCHEDULES = ("gpipe", "1f1b-flush", "1f1b", "hetpipe")
ASYNC_SCHEDULES = ("1f1b", "hetpipe")        # weight stashing, no flush between waves
SYNC_MODES = ("none", "wsp", "bsp", "sdpipe")


@dataclass(frozen=True, kw_only=True)
class StageSpec:
    gpu: str
    layers: tuple[int, int]          # [lo, hi) in the profile's layer order


@dataclass(frozen=True, kw_only=True)
class VirtualWorker:
    name: str
    stages: tuple[StageSpec, ...]


@dataclass(frozen=True, kw_only=True)
class SyncSpec:
    """How virtual workers synchronise. Fields a mode does not use are ignored by it.

    wsp: parameter servers, one push per wave; the pull before wave w blocks until the global clock
        (waves completed by every VW) is >= w - pull_offset - staleness_bound. pull_offset None means
        0 for flush schedules and 1 for asynchronous ones, so pipelining continues across the wave
        boundary (HetPipe leaves this open: ../shared/reference/hetpipe.md).
    bsp: ring all-reduce of each stage's gradients across VWs after every wave (Horovod).
    sdpipe: per-stage group scheduler, weight averaging by all-reduce inside each group (SDPipe).
    """

    mode: str = "none"
    staleness_bound: int = 0
    pull_offset: int | None = None
    ps_placement: str = "default"      # default: shards spread over nodes; local: by stage (HetPipe)
    sdpipe_period: int = 10
    sdpipe_wait_init_s: float = 1e-3
    sdpipe_wait_min_s: float = 1e-5
    sdpipe_wait_max_s: float = 1e-2

    def offset_for(self, schedule: str) -> int:
        if self.pull_offset is not None:
            return self.pull_offset
        return 1 if schedule in ASYNC_SCHEDULES else 0


@dataclass(frozen=True, kw_only=True)
class Plan:
    name: str
    model: str
    minibatch_size: int
    nm: int
    schedule: str
    sync: SyncSpec
    virtual_workers: tuple[VirtualWorker, ...]
    cluster: str = ""
    notes: str = ""
    optimizer_state_copies: int = 1    # SGD with momentum keeps one extra copy of the weights

    @property
    def gpus(self) -> list[str]:
        return [s.gpu for vw in self.virtual_workers for s in vw.stages]

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["virtual_workers"] = [{"name": vw.name, "stages": [{"gpu": s.gpu, "layers": list(s.layers)}
                                                               for s in vw.stages]}
                                  for vw in self.virtual_workers]
        return doc

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"


def plan_from_dict(data: Any, source_name: str = "plan") -> Plan:
    f = Fields(data, source_name)
    f.reject_unknown({"name", "model", "minibatch_size", "nm", "schedule", "sync", "virtual_workers",
                      "cluster", "notes", "optimizer_state_copies"})
    vws = []
    for v in f.records("virtual_workers"):
        v.reject_unknown({"name", "stages"})
        vws.append(VirtualWorker(name=v.text("name"), stages=tuple(_stage(s) for s in v.records("stages"))))
    names = [vw.name for vw in vws]
    for i, name in enumerate(names):
        if names.index(name) != i:
            raise f.error(f"virtual_workers[{i}].name", f"{name!r} is used twice")
    return Plan(name=f.text("name", "plan"), model=f.text("model", ""), cluster=f.text("cluster", ""),
                notes=f.text("notes", ""),
                minibatch_size=f.number("minibatch_size", positive=True, integer=True),
                nm=f.number("nm", positive=True, integer=True),
                schedule=f.text("schedule", choices=SCHEDULES),
                sync=_sync(f.sub("sync", None) or Fields({}, f.source, "sync")),
                virtual_workers=tuple(vws),
                optimizer_state_copies=f.number("optimizer_state_copies", 1, nonnegative=True, integer=True))


def _stage(f: Fields) -> StageSpec:
    f.reject_unknown({"gpu", "layers"})
    layers = f.list("layers")
    if not (len(layers) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in layers)):
        raise f.error("layers", f"expected [first, end) layer indices, got {layers!r}")
    if not 0 <= layers[0] < layers[1]:
        raise f.error("layers", f"{layers!r} must satisfy 0 <= first < end")
    return StageSpec(gpu=f.text("gpu"), layers=(layers[0], layers[1]))


def _sync(f: Fields) -> SyncSpec:
    defaults = SyncSpec()
    f.reject_unknown(SyncSpec.__dataclass_fields__)
    return SyncSpec(
        mode=f.text("mode", defaults.mode, choices=SYNC_MODES),
        staleness_bound=f.number("staleness_bound", 0, nonnegative=True, integer=True),
        pull_offset=f.number("pull_offset", None, nonnegative=True, integer=True),
        ps_placement=f.text("ps_placement", defaults.ps_placement, choices=("default", "local")),
        sdpipe_period=f.number("sdpipe_period", defaults.sdpipe_period, positive=True, integer=True),
        sdpipe_wait_init_s=f.number("sdpipe_wait_init_s", defaults.sdpipe_wait_init_s, positive=True),
        sdpipe_wait_min_s=f.number("sdpipe_wait_min_s", defaults.sdpipe_wait_min_s, positive=True),
        sdpipe_wait_max_s=f.number("sdpipe_wait_max_s", defaults.sdpipe_wait_max_s, positive=True),
    )


def load_plan(path: str | Path) -> Plan:
    path = resolve("plan", path)
    return plan_from_dict(Fields.load(path).data, path.name)


def save_plan(plan: Plan, path: str | Path) -> None:
    Path(path).write_text(plan.to_json())
