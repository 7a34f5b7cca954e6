"""A pipeline device as a SimPy process that replays its list of schedule actions.

A device runs one Stage, or several model chunks (virtual stages) under interleaved schedules; each
action names the chunk it works on. Each action kind has a small handler; handlers that may block
are generators.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hetsim.schedule.ir import Action
from hetsim.sim.collectives import ring_allreduce
from hetsim.sim.recorder import Recorder
from hetsim.sim.world import Device, World

__all__ = ["Stage", "device_process"]


@dataclass(eq=False)
class Stage:
    vw: int
    index: int
    n_stages: int
    gpu: str
    device: Device
    layers: tuple[int, int]
    fwd_s: float
    bwd_s: float
    out_bytes: int                     # activations sent downstream per minibatch
    in_bytes: int                      # gradients sent upstream per minibatch (= input activations)
    param_bytes: int
    prev_gpu: str | None
    next_gpu: str | None
    nm: int
    asynchronous: bool
    members: tuple[str, ...] = ()      # the tensor-parallel group (the stage's GPU alone if none)
    member_devices: tuple[Device, ...] = ()
    tp_allreduce_bytes: int = 0        # per forward, when the times leave them out
    tp_allreduce_calls: int = 0        # the calls those bytes go in
    tp_allreduce_bwd_bytes: int = 0    # per backward (Megatron: a lookup's only forward, a head's only backward)
    tp_allreduce_bwd_calls: int = 0
    update_s: float = 0.0              # optimizer step of this stage's weights
    bwd_weight_s: float = 0.0          # split backward (zero bubble): the W part of bwd_s; I runs the rest
    blocking_p2p: bool = False         # a send holds the stage until delivered (Plan.blocking_p2p)
    # A transfer starts once both sides reach it (registry explicit_p2p, unless Plan.blocking_p2p).
    rendezvous_p2p: bool = False
    # On the VW's first device (virtual stage 0's GPU): its sync waits are the VW's, every chunk's,
    # as executor.measure counts the first rank's.
    first_device: bool = False
    applied: int = 0                   # own minibatches whose updates are in the local weights
    # WSP: the global clock of the weights pulled for each wave not yet pushed. A wave's update is
    # as stale as the weights its forwards ran on; a 1F1B stage pulls wave w + 1 before it pushes w.
    pulled: dict[int, int] = field(default_factory=dict)
    position: int = field(default=0)   # index of the action being run (for deadlock reports)


def device_process(world: World, rec: Recorder, sync, chunks: tuple[Stage, ...], actions: tuple[Action, ...]):
    """Replay a device's actions in order, each on the Stage of the chunk it names."""
    for position, (kind, index, chunk) in enumerate(actions):
        for stage in chunks:
            stage.position = position
        step = _HANDLERS[kind](world, rec, sync, chunks[chunk], index)
        if step is not None:
            yield from step
    for stage in chunks:
        stage.position = len(actions)


def _compute(world: World, rec: Recorder, stage: Stage, seconds: float, name: str):
    """Work on the stage's GPU, or in lockstep on every GPU of its tensor-parallel group."""
    env = world.env
    start = env.now
    devices = stage.member_devices or (stage.device,)
    for device in devices:
        device.compute.start(start)
    yield env.all_of([device.run(seconds) for device in devices]) if len(devices) > 1 else stage.device.run(seconds)
    for device in devices:
        device.compute.stop(env.now)
    for gpu in stage.members or (stage.gpu,):
        rec.span(gpu, name, start, "compute")


def _tp_allreduce(world: World, rec: Recorder, stage: Stage, name: str, backward: bool = False):
    """Megatron's activation all-reduces of a pass, its calls as one ring over the group's links."""
    nbytes, calls = ((stage.tp_allreduce_bwd_bytes, stage.tp_allreduce_bwd_calls) if backward
                     else (stage.tp_allreduce_bytes, stage.tp_allreduce_calls))
    if nbytes and len(stage.members) > 1:
        start = world.env.now
        yield from ring_allreduce(world, list(stage.members), nbytes, calls)
        for gpu in stage.members:
            rec.span(gpu, name, start, "sync")


def _forward(world, rec, sync, stage: Stage, mb: int):
    delay = stage.device.straggle()
    if delay:
        yield world.env.timeout(delay)
    # Local staleness: own earlier minibatches whose updates this forward does not see.
    expected = mb if stage.asynchronous else mb - mb % stage.nm
    rec.staleness_local.append((stage.vw, stage.index, mb, expected - stage.applied))
    yield from _compute(world, rec, stage, stage.fwd_s, f"F{mb}")
    yield from _tp_allreduce(world, rec, stage, f"tp F{mb}")


def _backward(world, rec, sync, stage: Stage, mb: int):
    yield from _compute(world, rec, stage, stage.bwd_s, f"B{mb}")
    yield from _tp_allreduce(world, rec, stage, f"tp B{mb}", backward=True)
    if stage.index == 0:
        rec.minibatch_done(stage.vw)


def _backward_input(world, rec, sync, stage: Stage, mb: int):
    """Zero bubble's I: the input gradient, what the previous stage waits for."""
    yield from _compute(world, rec, stage, stage.bwd_s - stage.bwd_weight_s, f"I{mb}")
    yield from _tp_allreduce(world, rec, stage, f"tp I{mb}", backward=True)


def _backward_weight(world, rec, sync, stage: Stage, mb: int):
    """Zero bubble's W: the weight gradient, deferred to fill what would be bubble."""
    yield from _compute(world, rec, stage, stage.bwd_weight_s, f"W{mb}")
    if stage.index == 0:
        rec.minibatch_done(stage.vw)


def _send(world: World, rec: Recorder, stage: Stage, dst: str, nbytes: int, key: tuple):
    """Start the transfer. The stage goes on at once unless the send occupies it (World.send) or the
    runtime's point-to-point calls are blocking (Megatron waits for each send to complete). Under a
    rendezvous the transfer waits for its receiver, and the sender waits for the transfer."""
    if stage.rendezvous_p2p:
        return _rendezvous_send(world, rec, stage, dst, nbytes, key)
    sent, delivered = world.send(stage.gpu, dst, nbytes)
    delivered.callbacks.append(lambda _event: world.mailbox.put(key))
    if stage.blocking_p2p:
        return _waited(world, rec, stage, delivered, f"send {key[2]}{key[3]}")
    if sent is not None:
        return _until(sent)
    return None


def _until(event):
    yield event


def _rendezvous_send(world: World, rec: Recorder, stage: Stage, dst: str, nbytes: int, key: tuple):
    """The receiver's clear-to-send crosses the route back (one latency) before the data moves."""
    yield from _waited(world, rec, stage, world.mailbox.take(("posted", *key)), f"wait recv {key[2]}{key[3]}")
    latency = world.topology.route(dst, stage.gpu).latency_s
    if latency:
        yield from _waited(world, rec, stage, world.env.timeout(latency), f"clear to send {key[2]}{key[3]}")
    _sent, delivered = world.send(stage.gpu, dst, nbytes)
    delivered.callbacks.append(lambda _event: world.mailbox.put(key))
    yield from _waited(world, rec, stage, delivered, f"send {key[2]}{key[3]}")


def _waited(world: World, rec: Recorder, stage: Stage, event, name: str):
    """Idle until `event` (an arrival, or a blocking send's delivery), metered as a receive wait."""
    if event.processed:
        return
    meter, start = stage.device.recv_wait, world.env.now
    meter.start(start)
    yield event
    meter.stop(world.env.now)
    rec.span(stage.gpu, name, start, "wait")


def _send_f(world, rec, sync, stage: Stage, mb: int):
    return _send(world, rec, stage, stage.next_gpu, stage.out_bytes, (stage.vw, stage.index + 1, "F", mb))


def _send_b(world, rec, sync, stage: Stage, mb: int):
    return _send(world, rec, stage, stage.prev_gpu, stage.in_bytes, (stage.vw, stage.index - 1, "B", mb))


def _recv(world: World, rec: Recorder, stage: Stage, key: tuple):
    if stage.rendezvous_p2p:
        world.mailbox.put(("posted", *key))      # the sender may start the transfer now
    return _waited(world, rec, stage, world.mailbox.take(key), f"wait {key[2]}{key[3]}")


def _recv_f(world, rec, sync, stage: Stage, mb: int):
    return _recv(world, rec, stage, (stage.vw, stage.index, "F", mb))


def _recv_b(world, rec, sync, stage: Stage, mb: int):
    return _recv(world, rec, stage, (stage.vw, stage.index, "B", mb))


def _update(world, rec, sync, stage: Stage, mb: int):
    if stage.update_s:
        yield from _compute(world, rec, stage, stage.update_s, f"U{mb}")
    stage.applied = mb + 1


def _step(world, rec, sync, stage: Stage, wave: int):
    if stage.update_s:
        yield from _compute(world, rec, stage, stage.update_s, f"step {wave}")
    stage.applied = (wave + 1) * stage.nm


def _blocking_sync(method: str):
    def handler(world, rec, sync, stage: Stage, wave: int):
        return _timed_sync(world, rec, stage, getattr(sync, method)(stage, wave), f"{method} {wave}")
    return handler


def _timed_sync(world: World, rec: Recorder, stage: Stage, step, name: str):
    meters = [stage.device.sync_wait] + ([rec.vw_sync_wait[stage.vw]] if stage.first_device else [])
    start = world.env.now
    for meter in meters:
        meter.start(start)
    yield from step
    for meter in meters:
        meter.stop(world.env.now)
    rec.span(stage.gpu, name, start, "sync")


def _push(world, rec, sync, stage: Stage, wave: int):
    sync.push(stage, wave)


_HANDLERS = {
    "F": _forward, "B": _backward, "I": _backward_input, "W": _backward_weight,
    "SEND_F": _send_f, "SEND_B": _send_b, "RECV_F": _recv_f,
    "RECV_B": _recv_b, "UPDATE": _update, "STEP": _step, "PUSH": _push,
    "PULL": _blocking_sync("pull"), "ALLREDUCE": _blocking_sync("allreduce"),
    "GROUP_SYNC": _blocking_sync("group_sync"),
}
