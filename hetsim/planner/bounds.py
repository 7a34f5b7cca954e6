"""Best-first order of candidates by closed-form estimate, refining cheap upper bounds on demand.

Most of a large search's candidates never reach the top of the ranking, so they need not be
partitioned nor estimated. Each candidate (an allocation at one Nm) carries three figures, each an
upper bound of the next:

    0. before partitioning: n_VW x min over VWs of min(Nm / R, k / R, 1 / c_max), where R sums each
       layer's compute on the fastest GPU type of the VW and c_max is the largest such layer time
       (a stage holds at least one layer; k stages share at least R of compute);
    1. after partitioning: n_VW x the slowest VW's rate on its own (`vw_rate`);
    2. the estimate itself (`wsp_estimate`, `bsp_pipeline_estimate` with sync bsp, or the one
       given): pulls, all-reduces and link capacities only lower the rate of level 1.

A priority queue pops the largest figure; a popped bound is refined and pushed back, a popped
estimate is final. Every candidate left in the queue then has a bound, hence an estimate, no larger,
so estimates come out in the same order as estimating everything and sorting (A*-style lazy
evaluation; ties fall to staleness, Nm, then enumeration order, as in a stable sort).
"""

from __future__ import annotations

import heapq
from typing import Callable, Iterator

from hetsim.errors import PlanError
from hetsim.planner.estimate import Estimate, PsRoutes, bsp_pipeline_estimate, vw_rate, wsp_estimate
from hetsim.planner.hetero import VwPartition
from hetsim.profile import ModelProfile
from hetsim.topology import Topology

__all__ = ["LazyEstimate", "shape_bound", "best_first"]


def shape_bound(profile: ModelProfile, types: tuple[str, ...], nm: int, cache: dict, tp: int = 1) -> float:
    """Level 0: an upper bound of the rate of a VW on GPUs of `types` (one per stage), any split;
    with `tp`, stages of `tp` GPUs, each layer at its time at that degree as the partitioner takes it
    (the profile's TYPE@tp times, else a single GPU's divided by `tp`), before any all-reduce."""
    key = (tuple(sorted(set(types))), len(types), nm, tp)
    if key not in cache:
        keys = [profile.time_key(t, tp) for t in key[0]]
        fastest = [min((l.fwd_s[k] + l.bwd_s[k]) / divide for k, divide in keys) for l in profile.layers]
        total = sum(fastest)
        cache[key] = min(nm / total, len(types) / total, 1.0 / max(fastest)) if total > 0 else float("inf")
    return cache[key]


class LazyEstimate:
    """One allocation at one Nm: its partitions and estimate, each computed once, when first asked."""

    def __init__(self, bound: float, partition: Callable[[], list[VwPartition]], nm: int,
                 topology: Topology, estimate: Estimate | None = None, routes: PsRoutes | None = None,
                 sync: str = "wsp"):
        self.bounds = [bound]
        self.sync = sync
        self._partition, self.nm, self.topology, self.routes = partition, nm, topology, routes
        self.parts: list[VwPartition] | None = None
        self.error: PlanError | None = None
        self._estimate = estimate
        self.reported = False                  # the error has come out of best_first once

    def refine(self) -> float | None:
        """The next bound (or the estimate, at level 2); None when the allocation cannot run."""
        if len(self.bounds) == 1:
            try:
                self.parts = self._partition()
            except PlanError as exc:
                self.error = exc
                return None
            self.bounds.append(len(self.parts) * min(vw_rate(p, self.nm) for p in self.parts))
        elif len(self.bounds) == 2:
            self.bounds.append(self.estimate().minibatches_per_s)
        # Never above the bound before it (a given estimate may be below the level-1 figure).
        self.bounds[-1] = min(self.bounds[-1], self.bounds[-2])
        return self.bounds[-1]

    def estimate(self) -> Estimate:
        if self._estimate is None:
            parts = self.parts
            if self.sync == "bsp":            # flush schedules, one VW or many
                self._estimate = bsp_pipeline_estimate(parts, self.nm, self.topology)
            elif len(parts) == 1:
                self._estimate = Estimate(minibatches_per_s=vw_rate(parts[0], self.nm),
                                          bottleneck=parts[0].bottleneck_gpu)
            else:
                self._estimate = wsp_estimate(parts, self.nm, self.topology, self.routes)
        return self._estimate


def best_first(items: list[tuple[LazyEstimate, int, int]]) -> Iterator[tuple[int, LazyEstimate | None]]:
    """Indices of `items` ((lazy, staleness, nm), in enumeration order) by decreasing estimate, each
    as (index, lazy); an allocation that cannot run comes out once as (index, None) when found."""
    heap = [(-lazy.bounds[0], staleness, nm, i, 0) for i, (lazy, staleness, nm) in enumerate(items)]
    heapq.heapify(heap)
    while heap:
        _, staleness, nm, i, level = heapq.heappop(heap)
        lazy = items[i][0]
        if level == 2:
            yield i, lazy
            continue
        value = lazy.bounds[level + 1] if len(lazy.bounds) > level + 1 else lazy.refine()
        if value is None:
            if not lazy.reported:
                lazy.reported = True
                yield i, None
            continue
        heapq.heappush(heap, (-value, staleness, nm, i, level + 1))
