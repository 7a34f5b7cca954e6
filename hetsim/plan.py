"""Plans: virtual workers, their stages (GPU + layer range), Nm, the schedule and the sync mode.

A plan is pure data that round-trips to JSON; `check_plan` validates it against a cluster and a
profile (GPUs exist, layers covered, memory fits) and is the only place those rules live.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hetsim.data import resolve
from hetsim.fields import Fields
from hetsim.outputs import write_text
from hetsim.schedule.registry import ASYNC_SCHEDULES, SCHEDULES, schedule_kind

__all__ = ["StageSpec", "VirtualWorker", "SyncSpec", "Plan", "load_plan", "save_plan",
           "SCHEDULES", "SYNC_MODES", "ASYNC_SCHEDULES", "PRECISIONS", "ELEMENT_BYTES", "OPTIMIZERS",
           "activation_scale"]

SYNC_MODES = ("none", "wsp", "bsp", "sdpipe")
# Training precision. fp32: FP32 math on CUDA cores (TF32 off); tf32: FP32 storage, GEMMs in TF32 on
# tensor cores; fp16 / bf16: mixed precision, activations and GEMMs in 16 bit on tensor cores, with
# FP32 master weights in the optimizer (hetsim.memory counts the bytes of each).
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2}     # per activation/weight element moved
# Optimizer state per parameter: sgd none, momentum one buffer, adam/adamw two (exp_avg, exp_avg_sq).
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")


def activation_scale(precision: str) -> float:
    """Bytes an activation or its gradient takes on a link at `precision`, per byte a profile counts
    (profiles count them at FP32)."""
    return ELEMENT_BYTES[precision] / 4


@dataclass(frozen=True, kw_only=True)
class StageSpec:
    """One stage replica: layers [lo, hi) on `gpu`, or on a tensor-parallel group of GPUs of one node
    (`gpu` leads it, `tp_gpus` are the others; Megatron-style column/row split of each block)."""

    gpu: str
    layers: tuple[int, int]          # [lo, hi) in the profile's layer order
    tp_gpus: tuple[str, ...] = ()

    @property
    def tp(self) -> int:
        return 1 + len(self.tp_gpus)

    @property
    def members(self) -> tuple[str, ...]:
        return (self.gpu, *self.tp_gpus)


@dataclass(frozen=True, kw_only=True)
class VirtualWorker:
    name: str
    stages: tuple[StageSpec, ...]

    @property
    def n_devices(self) -> int:
        """Pipeline devices: the stages' distinct GPUs (fewer than the stages when a schedule with
        virtual stages puts several model chunks on each)."""
        return len(dict.fromkeys(s.gpu for s in self.stages))

    @property
    def chunks(self) -> int:
        return len(self.stages) // max(1, self.n_devices)


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
        return 1 if schedule_kind(schedule).asynchronous else 0


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
    # When set, memory follows the optimizer and precision (hetsim.memory) instead of the copies above.
    optimizer: str | None = None
    precision: str = "fp32"
    recompute: bool = False            # activation recomputation: a stage keeps only block inputs
    # Point-to-point sends between stages hold the sender until delivered (Megatron-LM's synchronous
    # p2p), rather than overlapping with its next compute (NCCL isend, PipeDream). Under a schedule
    # that lists its transfers (1f1b-deepspeed) it replaces the rendezvous: a send starts when its
    # sender reaches it and holds the sender alone; the receiver waits only for the data.
    blocking_p2p: bool = False

    @property
    def activation_scale(self) -> float:
        """Bytes an activation or its gradient takes on a link at the plan's precision, per byte a
        profile counts (profiles count them at FP32). Data-parallel gradients stay FP32 (main grads);
        a vocabulary-parallel loss's per-token values, FP32 in Megatron, are scaled with the rest (a few
        bytes a token beside a block's thousands)."""
        return activation_scale(self.precision)

    @property
    def gpus(self) -> list[str]:
        """Every GPU the plan uses, tensor-parallel members included."""
        return [g for vw in self.virtual_workers for s in vw.stages for g in s.members]

    def to_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["virtual_workers"] = [{"name": vw.name, "stages": [_stage_doc(s) for s in vw.stages]}
                                  for vw in self.virtual_workers]
        for key, default in (("optimizer", None), ("precision", "fp32"), ("recompute", False),
                             ("blocking_p2p", False)):
            if doc[key] == default:
                del doc[key]        # plans without them stay byte-identical to before
        return doc

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2) + "\n"


def _stage_doc(s: StageSpec) -> dict[str, Any]:
    if s.tp_gpus:
        return {"gpus": list(s.members), "layers": list(s.layers)}
    return {"gpu": s.gpu, "layers": list(s.layers)}


def plan_from_dict(data: Any, source_name: str = "plan") -> Plan:
    f = Fields(data, source_name)
    f.reject_unknown({"name", "model", "minibatch_size", "nm", "schedule", "sync", "virtual_workers",
                      "cluster", "notes", "optimizer_state_copies", "optimizer", "precision", "recompute",
                      "blocking_p2p"})
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
                optimizer_state_copies=f.number("optimizer_state_copies", 1, nonnegative=True, integer=True),
                optimizer=f.text("optimizer", None, choices=OPTIMIZERS) if f.has("optimizer") else None,
                precision=f.text("precision", "fp32", choices=PRECISIONS),
                recompute=f.flag("recompute"), blocking_p2p=f.flag("blocking_p2p"))



def _stage(f: Fields) -> StageSpec:
    f.reject_unknown({"gpu", "gpus", "layers"})
    layers = f.list("layers")
    if not (len(layers) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in layers)):
        raise f.error("layers", f"expected [first, end) layer indices, got {layers!r}")
    if not 0 <= layers[0] < layers[1]:
        raise f.error("layers", f"{layers!r} must satisfy 0 <= first < end")
    if f.has("gpus") == f.has("gpu"):
        raise f.error("gpu", "give either gpu (one GPU) or gpus (a tensor-parallel group), not both or neither")
    if f.has("gpu"):
        return StageSpec(gpu=f.text("gpu"), layers=(layers[0], layers[1]))
    group = f.list("gpus")
    if not group or not all(isinstance(g, str) and g for g in group):
        raise f.error("gpus", f"expected a list of GPU ids, got {group!r}")
    if len(set(group)) != len(group):
        raise f.error("gpus", f"{group!r} names a GPU twice")
    return StageSpec(gpu=group[0], tp_gpus=tuple(group[1:]), layers=(layers[0], layers[1]))


def _sync(f: Fields) -> SyncSpec:
    defaults = SyncSpec()
    f.reject_unknown(SyncSpec.__dataclass_fields__)
    spec = SyncSpec(
        mode=f.text("mode", defaults.mode, choices=SYNC_MODES),
        staleness_bound=f.number("staleness_bound", 0, nonnegative=True, integer=True),
        pull_offset=f.number("pull_offset", None, nonnegative=True, integer=True),
        ps_placement=f.text("ps_placement", defaults.ps_placement, choices=("default", "local")),
        sdpipe_period=f.number("sdpipe_period", defaults.sdpipe_period, positive=True, integer=True),
        sdpipe_wait_init_s=f.number("sdpipe_wait_init_s", defaults.sdpipe_wait_init_s, positive=True),
        sdpipe_wait_min_s=f.number("sdpipe_wait_min_s", defaults.sdpipe_wait_min_s, positive=True),
        sdpipe_wait_max_s=f.number("sdpipe_wait_max_s", defaults.sdpipe_wait_max_s, positive=True),
    )
    # The group scheduler's wait starts at init and adapts between min and max.
    if not spec.sdpipe_wait_min_s <= spec.sdpipe_wait_init_s <= spec.sdpipe_wait_max_s:
        raise f.error("sdpipe_wait_init_s", f"the waits must read min <= init <= max, got {spec.sdpipe_wait_min_s:g} "
                      f"<= {spec.sdpipe_wait_init_s:g} <= {spec.sdpipe_wait_max_s:g}")
    return spec


def load_plan(path: str | Path) -> Plan:
    path = resolve("plan", path)
    return plan_from_dict(Fields.load(path).data, path.name)


def save_plan(plan: Plan, path: str | Path) -> None:
    write_text(path, plan.to_json())
