"""Build a schedule's IR: the registry's order generator decides the order of forwards and backwards
on each device; `build_schedule` adds the point-to-point sends/receives, the optimiser actions and the
sync actions around them.
"""

from __future__ import annotations

from functools import lru_cache

from hetsim.errors import PlanError
from hetsim.schedule.ir import Action, Schedule
from hetsim.schedule.orders import FLUSH, OrderRequest, greedy_orders, warmup_forwards
from hetsim.schedule.registry import ScheduleKind, schedule_kind

__all__ = ["build_schedule", "warmup_forwards", "greedy_orders"]


@lru_cache(maxsize=64)
def build_schedule(name: str, n_stages: int, nm: int, waves: int, sync: str = "none",
                   costs: tuple[tuple[float, float, float], ...] | None = None, chunks: int = 1) -> Schedule:
    """The full IR for one virtual worker: `waves` waves of `nm` minibatches over `n_stages` devices,
    each holding `chunks` model chunks (schedules with virtual stages only).

    `costs` (per stage: forward, backward, transfer to the next stage, in seconds) shape the hetpipe
    order; without them every stage is taken as forward 1, backward 2, transfer 0.
    Sync actions by mode: wsp -> PULL before each wave w >= 1 and PUSH after it; bsp -> ALLREDUCE
    before each flush's STEP; sdpipe -> GROUP_SYNC after each wave; none -> nothing.
    """
    kind = schedule_kind(name)
    _check_request(kind, n_stages, nm, sync, chunks)
    n_mb = nm * waves
    orders = kind.orders(OrderRequest(n_stages, nm, n_mb, chunks, costs))
    stages = tuple(tuple(_device_actions(kind, orders[d], d, n_stages, chunks, nm, sync)) for d in range(n_stages))
    return Schedule(name=name, nm=nm, n_minibatches=n_mb, stages=stages, chunks=chunks)


def _check_request(kind: ScheduleKind, n_stages: int, nm: int, sync: str, chunks: int) -> None:
    name = kind.name
    if sync not in kind.sync_modes:
        raise PlanError(f"schedule {name}: sync {sync} is not supported; use {' or '.join(kind.sync_modes)}")
    if chunks != 1 and not kind.virtual_stages:
        raise PlanError(f"schedule {name}: chunks={chunks}, but {name} runs one model chunk per device")
    if kind.virtual_stages and nm % n_stages:
        raise PlanError(f"schedule {name}: nm={nm} must be a multiple of the {n_stages} devices "
                        "(Megatron's interleaved order works in groups of one minibatch per device)")


def _device_actions(kind: ScheduleKind, order: list[Action], d: int, n_devices: int, chunks: int, nm: int,
                    sync: str) -> list[Action]:
    """Device d's compute order with the receives, sends, optimiser and sync actions around it.
    Chunk c of device d is virtual stage c * n_devices + d (Schedule.virtual_stage)."""
    k = n_devices * chunks
    actions: list[Action] = []
    for kind_, i, chunk in order:
        s = chunk * n_devices + d
        if kind_ == FLUSH:
            actions += _flush_actions(i, sync, chunks)
        elif kind_ == "F" and not kind.explicit_p2p:
            if sync == "wsp" and i % nm == 0 and i > 0:
                actions.append(Action("PULL", i // nm))
            actions += _forward(s, k, i, chunk)
        elif kind_ == "W" or kind.explicit_p2p:
            # A weight gradient talks to no other stage; explicit transfers are already in the order.
            actions.append(Action(kind_, i, chunk))
        else:
            actions += _backward(s, k, i, chunk, kind_)
            if kind.asynchronous:
                actions.append(Action("UPDATE", i))
                if (i + 1) % nm == 0:
                    actions += _wave_end_async(i // nm, sync)
    return actions


def _forward(s: int, k: int, mb: int, chunk: int) -> list[Action]:
    """Virtual stage s of k (chunk `chunk` of its device): every action names the chunk it runs on."""
    return ([Action("RECV_F", mb, chunk)] if s > 0 else []) + [Action("F", mb, chunk)] + \
        ([Action("SEND_F", mb, chunk)] if s < k - 1 else [])


def _backward(s: int, k: int, mb: int, chunk: int, kind: str) -> list[Action]:
    return ([Action("RECV_B", mb, chunk)] if s < k - 1 else []) + [Action(kind, mb, chunk)] + \
        ([Action("SEND_B", mb, chunk)] if s > 0 else [])


def _flush_actions(wave: int, sync: str, chunks: int) -> list[Action]:
    """The end of a flush schedule's wave: every chunk's all-reduce (BSP), then every chunk's step."""
    steps = [Action("STEP", wave, c) for c in range(chunks)]
    if sync == "bsp":
        return [Action("ALLREDUCE", wave, c) for c in range(chunks)] + steps
    tail = {"wsp": [Action("PUSH", wave)], "sdpipe": [Action("GROUP_SYNC", wave)]}.get(sync, [])
    return steps + tail


def _wave_end_async(wave: int, sync: str) -> list[Action]:
    return {"wsp": [Action("PUSH", wave)], "sdpipe": [Action("GROUP_SYNC", wave)]}.get(sync, [])
