"""What a run records: the measurement window, per-device meters, staleness and the trace."""

from __future__ import annotations

from dataclasses import dataclass

from hetsim.sim.world import Meter, World
from hetsim.trace import TraceWriter
from hetsim.window import counted, window_closes, window_opens

__all__ = ["Recorder", "Snapshot"]


@dataclass
class Snapshot:
    t: float
    compute: dict[str, float]
    recv_wait: dict[str, float]
    sync_wait: dict[str, float]
    carried: dict[str, float]
    vw_sync_wait: list[float]


class Recorder:
    """Utilisation is measured over one window for all devices: it opens when the last VW finishes
    its warm-up minibatches and closes when the first VW finishes all of them, so every VW is running
    throughout; throughput is counted over the same window (hetsim.window)."""

    def __init__(self, world: World, n_vw: int, n_minibatches: int, warmup_minibatches: int,
                 trace: TraceWriter | None, drain: int = 0):
        self.world = world
        self.n_minibatches, self.warmup = n_minibatches, warmup_minibatches
        self.closing = counted(n_minibatches, warmup_minibatches, drain)    # the window's last completion
        self.completed = [0] * n_vw
        self.completion_times: list[list[float]] = [[] for _ in range(n_vw)]
        # Each VW's synchronisation waits, as its first stage sees them (as the executor counts
        # them): meters, so that a wait across the window's edge counts only its part inside.
        self.vw_sync_wait = [Meter() for _ in range(n_vw)]
        self.trace = trace
        self.start: Snapshot | None = None
        self.end: Snapshot | None = None
        self.staleness_local: list[tuple] = []
        self.staleness_global: list[tuple] = []
        self.gates: list[tuple] = []               # (vw, stage, wave, wait_s, c_global at pass)
        self._link_rates: dict[str, float] = {}
        self.rows: dict[str, tuple[str, str]] = {}   # gpu id -> (trace process, thread)
        if warmup_minibatches == 0:
            self.start = self.snapshot()

    def minibatch_done(self, vw: int) -> None:
        self.completed[vw] += 1
        self.completion_times[vw].append(self.world.env.now)
        # The rules are hetsim.window's; they can only change when this VW reaches warm-up or its end.
        if self.completed[vw] == self.warmup and self.start is None and window_opens(self.completed, self.warmup):
            self.start = self.snapshot()
        if (self.completed[vw] == self.closing and self.end is None and self.start is not None
                and window_closes(self.completed, self.closing)):
            self.end = self.snapshot()

    def snapshot(self) -> Snapshot:
        now = self.world.env.now
        self.world.net.advance()
        devices = self.world.devices
        return Snapshot(t=now,
                        compute={g: d.compute.read(now) for g, d in devices.items()},
                        recv_wait={g: d.recv_wait.read(now) for g, d in devices.items()},
                        sync_wait={g: d.sync_wait.read(now) for g, d in devices.items()},
                        carried=dict(self.world.net.carried),
                        vw_sync_wait=[m.read(now) for m in self.vw_sync_wait])

    def link_rates(self, now: float, use: dict[str, float]) -> None:
        """Counter rows of bandwidth in use per link (trace only)."""
        if self.trace is None:
            return
        for link in sorted(set(use) | set(self._link_rates)):
            rate = use.get(link, 0.0)
            if self._link_rates.get(link, 0.0) != rate:
                self.trace.counter("links", link, now, {"GB/s": rate / 1e9})
                self._link_rates[link] = rate
        self._link_rates = {k: v for k, v in self._link_rates.items() if v}

    def span(self, gpu: str, name: str, start: float, cat: str) -> None:
        if self.trace is not None and self.world.env.now > start:
            process, thread = self.rows[gpu]
            # The GPU id rides along so a reader need not parse it back out of the row's display name.
            self.trace.span(process, thread, name, start, self.world.env.now - start, cat=cat, args={"gpu": gpu})
