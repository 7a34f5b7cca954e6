"""Everything a simulation run shares: the clock, the links, the devices and the mailboxes.

No state lives in module globals, so simulations can run side by side (as SimPy's own design).
"""

from __future__ import annotations

import contextlib
import gc
import math

import numpy as np
import simpy

from hetsim.cluster import Cluster, GpuSlot, host_of
from hetsim.sim.fluid import FluidShare
from hetsim.topology import Topology

__all__ = ["CountingEnvironment", "Meter", "Device", "Mailbox", "World"]


class CountingEnvironment(simpy.Environment):
    """A SimPy environment that counts processed events (for benchmarks and reports)."""

    def __init__(self) -> None:
        super().__init__()
        self.events_processed = 0

    def step(self) -> None:
        self.events_processed += 1
        super().step()

    def run(self, until: float | simpy.Event | None = None):
        """As simpy's `run`, counting each step the same way (the call that finds the schedule
        empty included), with the cyclic garbage collector running less often meanwhile."""
        with _fewer_collections():
            if until is not None:
                return super().run(until)
            # The common case, to the end: simpy's loop without an extra frame per event.
            step, count = super().step, 0
            try:
                while True:
                    count += 1
                    step()
            except simpy.core.StopSimulation as stop:
                return stop.args[0]
            except simpy.core.EmptySchedule:
                return None
            finally:
                self.events_processed += count


@contextlib.contextmanager
def _fewer_collections():
    """A run allocates millions of short-lived events while holding a large live graph (processes,
    flows, pending events); at CPython's default of a young collection every 700 allocations, the
    older generations' scans took over a quarter of a 1,024-GPU run. Results never depend on it."""
    young, *older = gc.get_threshold()
    if young >= _GC_YOUNG:
        yield                       # already raised (a nested or concurrent run): leave it as found
        return
    gc.set_threshold(_GC_YOUNG, *older)
    try:
        yield
    finally:
        if gc.get_threshold()[0] == _GC_YOUNG:
            gc.set_threshold(young, *older)


_GC_YOUNG = 50_000          # allocations between young collections during a run (CPython: 700)


class Meter:
    """Accumulated seconds of one activity, readable while the activity is in progress."""

    __slots__ = ("total", "since")

    def __init__(self) -> None:
        self.total = 0.0
        self.since: float | None = None

    def start(self, now: float) -> None:
        self.since = now

    def stop(self, now: float) -> None:
        self.total += now - self.since
        self.since = None

    def read(self, now: float) -> float:
        return self.total + (now - self.since if self.since is not None else 0.0)


class Device:
    """One GPU (or CPU rank): runs compute for profiled seconds x slowdown x seeded jitter (and, for a
    process sharing a node's cores, x the node's colocated_work)."""

    def __init__(self, world: "World", slot: GpuSlot, *, slowdown: float, jitter_cv: float,
                 straggler_prob: float, straggler_delay_s: float, rng: np.random.Generator):
        self.world, self.slot = world, slot
        self.slowdown = slowdown
        # Lognormal jitter with mean 1 and the given coefficient of variation.
        self._sigma = math.sqrt(math.log1p(jitter_cv**2)) if jitter_cv > 0 else 0.0
        self._straggler = (straggler_prob, straggler_delay_s)
        self._rng = rng
        node = world.cluster.node(slot.node)
        self._cores = f"{slot.node}:cores" if node.shared_cores else None
        if self._cores:
            self.slowdown *= node.colocated_work
        self.compute = Meter()
        self.recv_wait = Meter()
        self.sync_wait = Meter()

    def run(self, seconds: float) -> simpy.Event:
        """An event that fires when `seconds` of profiled work is done on this device."""
        work = seconds * self.slowdown
        if self._sigma:
            work *= math.exp(self._sigma * self._rng.standard_normal() - self._sigma**2 / 2)
        if self._cores:
            return self.world.cores.transfer((self._cores,), work, cap=1.0)
        return self.world.env.timeout(work)

    def straggle(self) -> float:
        """Seconds to sleep before a step (SDPipe's straggler injection), usually 0."""
        prob, delay = self._straggler
        if prob > 0 and self._rng.random() < prob:
            return delay
        return 0.0


class Mailbox:
    """Point-to-point deliveries keyed by (vw, stage, kind, minibatch); either side may come first."""

    def __init__(self, env: simpy.Environment):
        self.env = env
        self._slots: dict[tuple, simpy.Event] = {}

    def _meet(self, key: tuple) -> simpy.Event:
        """The second side to arrive takes the event the first one left."""
        event = self._slots.pop(key, None)
        if event is None:
            event = self._slots[key] = self.env.event()
        return event

    def put(self, key: tuple) -> None:
        self._meet(key).succeed()

    def take(self, key: tuple) -> simpy.Event:
        return self._meet(key)


class World:
    def __init__(self, cluster: Cluster):
        self.env = CountingEnvironment()
        self.cluster = cluster
        self.topology = Topology(cluster)
        self.net = FluidShare(self.env, self.topology.capacity_Bps)
        self.cores = FluidShare(self.env, _core_capacities(cluster))
        self.mailbox = Mailbox(self.env)
        self.devices: dict[str, Device] = {}
        self._channel_tail: dict[tuple[str, str], simpy.Event] = {}
        self._channel_shares: dict[tuple[str, str], bool] = {}   # a pair shares a node's cores

    def transfer(self, src: str, dst: str, nbytes: float) -> simpy.Event:
        """Move bytes between endpoints (GPU ids or node hosts): latency, then the shared links.

        Transfers between one pair of endpoints go in order, one at a time (as messages on one
        NCCL/gloo channel do); transfers of different pairs share the links they cross fairly.
        """
        return self.send(src, dst, nbytes)[1]

    def send(self, src: str, dst: str, nbytes: float) -> tuple[simpy.Event | None, simpy.Event]:
        """A transfer as a point-to-point send sees it: (sender free, delivered).

        `sender free` is None where sending costs the sender nothing (NCCL on a GPU, or between
        nodes). Between processes sharing a node's cores it fires when the sender's own copy is done:
        gloo writes a message into the socket on the calling thread once its receive is posted
        (measured here: a 1 MiB isend returned after 0.57 ms, all of it CPU time, with the message
        delivered), so the sending rank computes nothing meanwhile.
        """
        channel = (src, dst)
        shares = self._channel_shares.get(channel)
        if shares is None:
            shares = self._channel_shares[channel] = self._shares_cores(src, dst)
        done = self.env.event()
        sent = self.env.event() if shares else None
        previous = self._channel_tail.get(channel)
        self._channel_tail[channel] = done
        if previous is None or previous.processed:
            self._start(channel, src, dst, nbytes, done, sent)
        else:
            previous.callbacks.append(lambda _e: self._start(channel, src, dst, nbytes, done, sent))
        return sent, done

    def _start(self, channel, src: str, dst: str, nbytes: float, done: simpy.Event,
               sent: simpy.Event | None) -> None:
        route = self.topology.route(src, dst)

        def finish(_event):
            if self._channel_tail.get(channel) is done:
                del self._channel_tail[channel]
            done.succeed()

        # The sender's copy starts at once (into the socket); the receiver's after the latency.
        copy_out = self._copy(src, nbytes) if sent is not None else None
        if copy_out is not None:
            copy_out.callbacks.append(lambda _e: sent.succeed())

        def flow(_event=None):
            moved = self.net.transfer(route.links, nbytes)
            if copy_out is not None:
                moved = self.env.all_of([moved, copy_out, self._copy(dst, nbytes)])
            moved.callbacks.append(finish)
        if route.latency_s:
            self.env.timeout(route.latency_s).callbacks.append(flow)
        else:
            flow()

    def _shares_cores(self, src: str, dst: str) -> bool:
        node = self.topology.node_of(src)
        return f"{node}:cores" in self.cores.capacity and self.topology.node_of(dst) == node

    def _copy(self, endpoint: str, nbytes: float) -> simpy.Event:
        """Between processes sharing a node's cores, the cores move the bytes (gloo over loopback
        sockets): a copy out of the sender and one into the receiver, each nbytes / bandwidth
        core-seconds on that process's one communication thread (`<endpoint>:io`, one core). Alone on
        an idle host that takes nbytes / bandwidth, as the link does; among busy ranks the copies get
        their share of the cores like compute, and a process that many others send to (a parameter
        server) moves their bytes one core's worth at a time. Where the node names `copy_cores` (ranks
        sharing a GPU), the copies take those cores instead, and leave the shared GPU to compute."""
        node = self.topology.node_of(endpoint)
        spec = self.cluster.node(node)
        seconds = nbytes / spec.intra_link.bandwidth_Bps
        cores = f"{node}:copy" if spec.copy_cores else f"{node}:cores"
        return self.cores.transfer((cores, f"{endpoint}:io"), seconds)

    def host(self, node: str) -> str:
        return host_of(node)


def _core_capacities(cluster: Cluster) -> dict[str, float]:
    """Nodes with shared cores: the cores, and one communication thread per process on them (each
    device's rank and the node's parameter-server process)."""
    out: dict[str, float] = {}
    for node in cluster.nodes:
        if node.shared_cores:
            out[f"{node.name}:cores"] = float(node.shared_cores)
            if node.copy_cores:
                out[f"{node.name}:copy"] = float(node.copy_cores)
            for endpoint in [g.id for g in node.gpus] + [host_of(node.name)]:
                out[f"{endpoint}:io"] = 1.0
    return out
