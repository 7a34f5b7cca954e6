"""Capacities shared max-min fairly by the flows crossing them (a fluid model).

Links are the main use: a transfer is a flow of bytes over a route, and while n flows cross a link
each gets at most capacity / n, so two equal transfers on one link each take twice as long as one
alone. Rates are recomputed by progressive filling whenever a flow starts or ends, but only for the
flows connected to it through shared capacities: max-min fairness decomposes over those components.
The same model shares CPU cores among ranks (amount = core-seconds, each flow capped at one core).

Speed: a solve depends only on the routes and caps of the flows it covers, and a running pipeline
meets the same few sets of concurrent flows again and again, so solves (and component searches) are
remembered, keyed by the flows' kinds (route and cap, numbered as first seen) in flow-id order. A
remembered solve is the very list of floats the solver returned, so outputs are bit-identical to
solving every time (issue 17: the 16-GPU HetPipe run 1.4-1.65x faster, 1,024 GPUs about 1.1x).
Each rate change leaves an outdated finish prediction in the heap; once they outnumber the live
ones a few times over they are dropped in one pass, which keeps the heap (and every push and
pop) small at 1,024 GPUs.

Clock safety: a flow keeps the amount left as of its last rate change (`since`) and its finish is
predicted once from there, `since + remaining / rate`; when that instant comes the flow is done, by
definition, without subtracting huge absolute times to check. So a transfer takes amount / rate at
any clock value (a float clock at 1e12 s has a resolution of about 1e-4 s, which a re-check of
"bytes moved = rate x (now - since)" would turn into endless re-predictions).
"""

from __future__ import annotations

import heapq
import math
from operator import attrgetter
from typing import Callable

import numpy as np
import simpy

__all__ = ["FluidShare"]


class _Flow:
    __slots__ = ("id", "links", "columns", "remaining", "cap", "rate", "since", "done", "version", "kind")

    def __init__(self, flow_id: int, links: tuple[str, ...], amount: float, cap: float,
                 now: float, done: simpy.Event, columns=None, kind: int = -1):
        self.id, self.links, self.cap, self.done = flow_id, links, cap, done
        self.columns = columns                  # link indices into FluidShare's capacity vector
        self.kind = kind                        # (links, cap) as numbered by FluidShare: a memo key
        self.remaining = amount                 # as of `since`, the last rate change
        self.rate, self.since, self.version = 0.0, now, 0


class _Memo:
    """Remembered results, dropped all at once past a budget (a bound on memory; a result never
    depends on what is remembered)."""

    __slots__ = ("_held", "_size", "_budget")

    def __init__(self, budget: int):
        self._held: dict = {}
        self._size, self._budget = 0, budget

    def get(self, key):
        return self._held.get(key)

    def put(self, key, value, size: int):
        if self._size + size > self._budget:
            self._held.clear()
            self._size = 0
        self._held[key] = value
        self._size += size
        return value


class _Solver:
    """One max-min solver with a memo of its results, keyed by the kinds of the flows it solved."""

    __slots__ = ("solve", "memo")

    def __init__(self, solve: Callable[[list[_Flow], tuple[int, ...]], list[float]]):
        self.solve, self.memo = solve, _Memo(_MEMO_FLOWS)

    def rates(self, flows: list[_Flow]) -> list[float]:
        key = tuple(map(_KIND, flows))
        rates = self.memo.get(key)
        if rates is None:
            rates = self.memo.put(key, self.solve(flows, key), len(key))
        return rates


class _Kinds:
    """The (route, cap) kinds of flows seen so far, numbered, with a padded kind x link table so
    that a global solve builds its flow x link incidence list in a few array operations."""

    def __init__(self, column: dict[str, int]):
        self._column = column
        self._number: dict[tuple[tuple[str, ...], float], int] = {}
        self._columns: list[np.ndarray] = []
        self._caps: list[float] = []
        self._table = self._cap_table = None     # rebuilt when a new kind appears

    def of(self, links: tuple[str, ...], cap: float) -> tuple[int, np.ndarray]:
        kind = self._number.get((links, cap))
        if kind is None:
            kind = self._number[(links, cap)] = len(self._columns)
            self._columns.append(np.array([self._column[name] for name in links]))
            self._caps.append(cap)
            self._table = None
        return kind, self._columns[kind]

    def incidence(self, kinds: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(columns, rows, caps) for flows of these kinds, as _max_min_rates_numpy builds them."""
        if self._table is None:
            width = max(len(c) for c in self._columns)
            self._table = np.full((len(self._columns), width), -1, dtype=np.int64)
            for k, c in enumerate(self._columns):
                self._table[k, :len(c)] = c
            self._cap_table = np.array(self._caps, dtype=float)
        index = np.array(kinds, dtype=np.int64)
        padded = self._table[index]
        used = padded >= 0
        return padded[used], np.nonzero(used)[0], self._cap_table[index]


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
        self._kinds = _Kinds({name: i for i, name in enumerate(capacity)})
        vector = np.array(list(capacity.values()), dtype=float)
        self._component_solver = _Solver(lambda flows, _key: _max_min_rates(flows, capacity))
        self._global_solver = _Solver(lambda _flows, key: _fill(*self._kinds.incidence(key), vector))
        self._components = _Memo(_MEMO_FLOWS)

    @property
    def active(self) -> int:
        return len(self._flows)

    def transfer(self, links: tuple[str, ...], amount: float, cap: float = math.inf) -> simpy.Event:
        """An event that fires when `amount` has crossed every capacity in `links`."""
        done = self.env.event()
        if amount <= 0 or not links:
            done.succeed()
            return done
        kind, columns = self._kinds.of(links, cap)
        flow = _Flow(self._next_id, links, float(amount), cap, self.env.now, done, columns, kind)
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

    def _component_rates(self, links) -> tuple[list[_Flow], list[float]]:
        """The component of `links` and its rates. The kinds of all active flows in id order, with
        the set of links, fix both, so they are remembered by that key (cheaper than the search)."""
        active = list(self._flows.values())
        key = (tuple([f.kind for f in active]), frozenset(links))
        found = self._components.get(key)
        if found is None:
            flows = self._component(links)
            position = {f.id: i for i, f in enumerate(active)}
            found = self._components.put(key, ([position[f.id] for f in flows],
                                               self._component_solver.rates(flows)), len(active))
        positions, rates = found
        return [active[i] for i in positions], rates

    def _rebalance(self, links) -> None:
        if len(self._flows) >= _VECTOR_FROM:
            # Many flows (e.g. every VW pushing to the same parameter servers) are nearly always one
            # component: solve all at once, vectorised, instead of searching for it first.
            flows = list(self._flows.values())
            rates = self._global_solver.rates(flows)
        else:
            flows, rates = self._component_rates(links)
        self._apply(flows, rates)
        if self.on_rates is not None:
            self._report_rates(links, flows)
        self._arm_timer()

    def _apply(self, flows: list[_Flow], rates: list[float]) -> None:
        """Settle and re-predict the flows whose share changed (`_settle`, inlined: the hot loop)."""
        now = self.env.now
        carried, finish, push = self.carried, self._finish, heapq.heappush
        for flow, rate in zip(flows, rates):
            if rate != flow.rate:
                moved, remaining = flow.rate * (now - flow.since), flow.remaining
                if moved > remaining:            # min(), without the call
                    moved = remaining
                if moved > 0:
                    remaining = flow.remaining = remaining - moved
                    for name in flow.links:
                        carried[name] += moved
                flow.since = now
                flow.rate = rate
                version = flow.version = flow.version + 1
                push(finish, (now + remaining / rate, flow.id, version, flow))

    def _report_rates(self, links, flows: list[_Flow]) -> None:
        use = {name: 0.0 for name in links}
        for flow in flows:
            for name in flow.links:
                use[name] = use.get(name, 0.0) + flow.rate
        self.on_rates(self.env.now, use)

    def _arm_timer(self) -> None:
        finish = self._finish
        if len(finish) > _STALE_FACTOR * len(self._flows) + _STALE_SLACK:
            finish = self._compact()
        while finish and finish[0][2] != finish[0][3].version:
            heapq.heappop(finish)                    # an outdated prediction
        if not finish or finish[0][0] >= self._timer_at:
            return
        at = finish[0][0]
        self._timer_at = at
        self.env.timeout(max(at - self.env.now, 0.0)).callbacks.append(lambda _e: self._on_timer(at))

    def _compact(self) -> list:
        """Drop outdated predictions in one pass (each rate change leaves one behind). The heap pops
        in (time, flow id, version) order whatever its shape, so this changes no outcome."""
        flows = self._flows
        live = [e for e in self._finish if e[2] == e[3].version and e[1] in flows]
        heapq.heapify(live)
        self._finish = live
        return live

    def _on_timer(self, at: float) -> None:
        if at != self._timer_at:
            return                                   # superseded by an earlier timer
        self._timer_at = math.inf
        # Every flow predicted to end by `at` is done (the clock may read `at` give or take a unit
        # in the last place: now + (at - now) need not round back to `at`).
        finished: list[_Flow] = []
        finish, flows = self._finish, self._flows
        while finish and finish[0][0] <= at:
            _, fid, version, flow = heapq.heappop(finish)
            if version == flow.version and fid in flows:
                finished.append(flow)
        touched: list[str] = []
        carried, on_link = self.carried, self._on_link
        for flow in finished:
            left = flow.remaining                    # exactly what was left at its last rate change
            flow.remaining = 0.0
            for name in flow.links:
                carried[name] += left
                del on_link[name][flow.id]
            del flows[flow.id]
            touched.extend(flow.links)
            flow.done.succeed()
        if touched:
            self._rebalance(touched)
        else:
            self._arm_timer()


_KIND = attrgetter("kind")
_VECTOR_FROM = 128        # active flows from which one vectorised solve beats per-component ones
_STALE_FACTOR = 3         # predictions per active flow past which outdated ones are dropped at once
_STALE_SLACK = 64         # ... plus these many (a small heap is cheap to keep)
_MEMO_FLOWS = 500_000     # flow entries one memo holds before it starts over (tens of MB at most)


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
    caps = np.fromiter((f.cap for f in flows), dtype=float, count=len(flows))
    return _fill(cols, rows, caps, capacity)


def _fill(cols: np.ndarray, rows: np.ndarray, caps: np.ndarray, capacity: np.ndarray) -> list[float]:
    """Progressive filling of flows with these caps, flow `rows[i]` crossing link `cols[i]`."""
    n = len(caps)
    left = capacity.copy()
    users = np.bincount(cols, minlength=len(capacity)).astype(float)
    rates = np.zeros(n)
    active = np.ones(n, dtype=bool)
    while active.any():
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(users > 0, left / users, np.inf)
        level = min(share.min(), caps[active].min())
        limit = level * (1 + 1e-12)
        hits = np.zeros(n, dtype=bool)
        hits[rows[share[cols] <= limit]] = True
        freeze = active & (hits | (caps <= limit))
        rates[freeze] = level
        counts = np.bincount(cols[freeze[rows]], minlength=len(capacity))
        left -= counts * level
        users -= counts
        active &= ~freeze
    return rates.tolist()
