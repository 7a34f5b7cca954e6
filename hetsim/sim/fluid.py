"""Capacities shared max-min fairly by the flows crossing them (a fluid model).

Links are the main use: a transfer is a flow of bytes over a route, and while n flows cross a link
each gets at most capacity / n, so two equal transfers on one link each take twice as long as one
alone. Rates are recomputed by progressive filling whenever a flow starts or ends, but only for the
flows connected to it through shared capacities: max-min fairness decomposes over those components.
The same model shares CPU cores among ranks (amount = core-seconds, each flow capped at one core).

Clock safety: a flow keeps the amount left as of its last rate change (`since`) and its finish is
predicted once from there, `since + remaining / rate`; when that instant comes the flow is done, by
definition, without subtracting huge absolute times to check. So a transfer takes amount / rate at
any clock value (a float clock at 1e12 s has a resolution of about 1e-4 s, which a re-check of
"bytes moved = rate x (now - since)" would turn into endless re-predictions).
"""

from __future__ import annotations

import heapq
import math
from typing import Callable

import numpy as np
import simpy

__all__ = ["FluidShare"]


class _Flow:
    __slots__ = ("id", "links", "columns", "remaining", "cap", "rate", "since", "done", "version")

    def __init__(self, flow_id: int, links: tuple[str, ...], amount: float, cap: float,
                 now: float, done: simpy.Event, columns=None):
        self.id, self.links, self.cap, self.done = flow_id, links, cap, done
        self.columns = columns                  # link indices into FluidShare's capacity vector
        self.remaining = amount                 # as of `since`, the last rate change
        self.rate, self.since, self.version = 0.0, now, 0


class FluidShare:
    """Flows over named capacities; `carried[name]` counts the amount each capacity has moved."""

    def __init__(self, env: simpy.Environment, capacity: dict[str, float],
                 on_rates: Callable[[float, dict[str, float]], None] | None = None):
        self.env = env
        self.capacity = capacity
        self.carried = {name: 0.0 for name in capacity}
        self.on_rates = on_rates
        self._on_link: dict[str, dict[int, _Flow]] = {name: {} for name in capacity}
        self._flows: dict[int, _Flow] = {}
        self._finish: list[tuple[float, int, int, _Flow]] = []   # (time, flow id, version, flow)
        self._next_id = 0
        self._timer_at = math.inf
        self._dirty: list[str] = []                  # links of flows started this instant
        self._column = {name: i for i, name in enumerate(capacity)}
        self._capacity_vector = np.array(list(capacity.values()), dtype=float)
        self._columns: dict[tuple[str, ...], np.ndarray] = {}

    @property
    def active(self) -> int:
        return len(self._flows)

    def transfer(self, links: tuple[str, ...], amount: float, cap: float = math.inf) -> simpy.Event:
        """An event that fires when `amount` has crossed every capacity in `links`."""
        done = self.env.event()
        if amount <= 0 or not links:
            done.succeed()
            return done
        columns = self._columns.get(links)
        if columns is None:
            columns = self._columns[links] = np.array([self._column[name] for name in links])
        flow = _Flow(self._next_id, links, float(amount), cap, self.env.now, done, columns)
        self._next_id += 1
        self._flows[flow.id] = flow
        for name in links:
            self._on_link[name][flow.id] = flow
        # Flows often start in bursts at one instant (a push to every shard): rebalance once.
        if not self._dirty:
            self.env.timeout(0).callbacks.append(self._start_dirty)
        self._dirty.extend(links)
        return done

    def _start_dirty(self, _event) -> None:
        links, self._dirty = self._dirty, []
        self._rebalance(links)

    def advance(self) -> None:
        """Bring `carried` up to now for every flow (for snapshots between events)."""
        for flow in self._flows.values():
            self._settle(flow)

    def _settle(self, flow: _Flow) -> None:
        """Move the flow's progress since `since` into `carried` (never more than it has left)."""
        moved = min(flow.rate * (self.env.now - flow.since), flow.remaining)
        if moved > 0:
            self._carry(flow, moved)
        flow.since = self.env.now

    def _carry(self, flow: _Flow, amount: float) -> None:
        flow.remaining -= amount
        for name in flow.links:
            self.carried[name] += amount

    def _component(self, links) -> list[_Flow]:
        """Every flow connected to `links` through shared capacities, in flow-id order."""
        seen_links, found, todo = set(), {}, list(links)
        while todo:
            name = todo.pop()
            if name in seen_links:
                continue
            seen_links.add(name)
            for fid, flow in self._on_link[name].items():
                if fid not in found:
                    found[fid] = flow
                    todo.extend(flow.links)
        return [found[fid] for fid in sorted(found)]

    def _rebalance(self, links) -> None:
        if len(self._flows) >= _VECTOR_FROM:
            # Many flows (e.g. every VW pushing to the same parameter servers) are nearly always one
            # component: solve all at once, vectorised, instead of searching for it first.
            flows = list(self._flows.values())
            rates = _max_min_rates_numpy(flows, self._capacity_vector)
        else:
            flows = self._component(links)
            rates = _max_min_rates(flows, self.capacity)
        now = self.env.now
        # Only flows whose share changed need their progress settled and their finish re-predicted.
        for flow, rate in zip(flows, rates):
            if rate != flow.rate:
                self._settle(flow)
                flow.rate = rate
                flow.version += 1
                heapq.heappush(self._finish, (now + flow.remaining / rate, flow.id, flow.version, flow))
        if self.on_rates is not None:
            self._report_rates(links, flows)
        self._arm_timer()

    def _report_rates(self, links, flows: list[_Flow]) -> None:
        use = {name: 0.0 for name in links}
        for flow in flows:
            for name in flow.links:
                use[name] = use.get(name, 0.0) + flow.rate
        self.on_rates(self.env.now, use)

    def _arm_timer(self) -> None:
        while self._finish and self._finish[0][2] != self._finish[0][3].version:
            heapq.heappop(self._finish)              # an outdated prediction
        if not self._finish or self._finish[0][0] >= self._timer_at:
            return
        at = self._finish[0][0]
        self._timer_at = at
        self.env.timeout(max(at - self.env.now, 0.0)).callbacks.append(lambda _e: self._on_timer(at))

    def _on_timer(self, at: float) -> None:
        if at != self._timer_at:
            return                                   # superseded by an earlier timer
        self._timer_at = math.inf
        # Every flow predicted to end by `at` is done (the clock may read `at` give or take a unit
        # in the last place: now + (at - now) need not round back to `at`).
        finished: list[_Flow] = []
        while self._finish and self._finish[0][0] <= at:
            _, _, version, flow = heapq.heappop(self._finish)
            if version == flow.version and flow.id in self._flows:
                finished.append(flow)
        touched: list[str] = []
        for flow in finished:
            self._carry(flow, flow.remaining)        # exactly what was left at its last rate change
            del self._flows[flow.id]
            for name in flow.links:
                del self._on_link[name][flow.id]
            touched.extend(flow.links)
            flow.done.succeed()
        if touched:
            self._rebalance(touched)
        else:
            self._arm_timer()


_VECTOR_FROM = 128        # active flows from which one vectorised solve beats per-component ones


def _max_min_rates(flows: list[_Flow], capacity: dict[str, float]) -> list[float]:
    """Max-min fair rates by progressive filling: raise all rates together, freezing each flow at its
    bottleneck (a saturated capacity, or its own cap)."""
    if len(flows) == 1:
        f = flows[0]
        return [min(f.cap, min(capacity[name] for name in f.links))]
    left: dict[str, float] = {}
    users: dict[str, int] = {}
    for f in flows:
        for name in f.links:
            users[name] = users.get(name, 0) + 1
            left[name] = capacity[name]
    rates = [0.0] * len(flows)
    unfrozen = list(range(len(flows)))
    while unfrozen:
        level = min(min(left[name] / n for name, n in users.items() if n > 0),
                    min(flows[i].cap for i in unfrozen))
        limit = level * (1 + 1e-12)
        saturated = {name for name, n in users.items() if n > 0 and left[name] / n <= limit}
        still = []
        for i in unfrozen:
            f = flows[i]
            if f.cap <= limit or not saturated.isdisjoint(f.links):
                rates[i] = level
                for name in f.links:
                    left[name] -= level
                    users[name] -= 1
            else:
                still.append(i)
        unfrozen = still
    return rates


def _max_min_rates_numpy(flows: list[_Flow], capacity: np.ndarray) -> list[float]:
    """The same progressive filling over a flow x link incidence list; `capacity` is indexed by the
    flows' `columns`."""
    cols = np.concatenate([f.columns for f in flows])
    rows = np.repeat(np.arange(len(flows)), [len(f.columns) for f in flows])
    left = capacity.copy()
    users = np.bincount(cols, minlength=len(capacity)).astype(float)
    caps = np.fromiter((f.cap for f in flows), dtype=float, count=len(flows))
    rates = np.zeros(len(flows))
    active = np.ones(len(flows), dtype=bool)
    while active.any():
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(users > 0, left / users, np.inf)
        level = min(share.min(), caps[active].min())
        limit = level * (1 + 1e-12)
        hits = np.zeros(len(flows), dtype=bool)
        hits[rows[share[cols] <= limit]] = True
        freeze = active & (hits | (caps <= limit))
        rates[freeze] = level
        counts = np.bincount(cols[freeze[rows]], minlength=len(capacity))
        left -= counts * level
        users -= counts
        active &= ~freeze
    return rates.tolist()
