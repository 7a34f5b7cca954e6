"""PipeDream's partitioner for homogeneous GPUs: dynamic programming over a sequence of states.

Narayanan et al., "PipeDream: generalized pipeline parallelism for DNN training", SOSP'19, section
3.1. A *state* is a down-set of the layer DAG (everything computed up to some cut); for a chain of
layers the states are the n + 1 prefixes, for a branching graph they come from augmented antichains
(`hetsim.planner.antichain`). A stage is the difference of two nested states. With r replicas a
stage takes

    T(i -> j, r) = max(compute(i -> j), 4 (r - 1) |w(i -> j)| / (r B)) / r

(compute and the weight all-reduce overlap, as in the paper), and the activations crossing a cut
cost 2 a / B (forward activations, backward gradients). The DP

    A[j][m] = min over nested i < j and r <= m of max(A[i][m - r], T(i -> j, r), 2 a(i) / B)

gives the smallest slowest-stage time for covering state j with exactly m GPUs; the answer uses at
most `n_gpus`. Hierarchical bandwidth (PipeDream's multi-level planner) solves every sub-range inside
one server at its bandwidth, then treats each server as one worker at the next level.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetsim.errors import PlanError

FLOAT32_STATES = 1000

__all__ = ["ChainStage", "ChainPartition", "StateCosts", "chain_costs", "pipedream_partition",
           "hierarchical_partition", "stage_time"]


@dataclass(frozen=True, kw_only=True)
class StateCosts:
    """Cumulative costs of each state (state 0 = nothing computed, last = the whole model).

    compute_s[i]: forward + backward seconds of the layers in state i's down-set;
    param_bytes[i]: their weights; cut_bytes[i]: activation bytes that cross the cut after state i;
    nested[i, j]: whether state i's down-set is a strict subset of state j's (a stage may run i -> j).
    """

    compute_s: np.ndarray
    param_bytes: np.ndarray
    cut_bytes: np.ndarray
    nested: np.ndarray

    @property
    def n_states(self) -> int:
        return len(self.compute_s)


@dataclass(frozen=True, kw_only=True)
class ChainStage:
    states: tuple[int, int]          # [first, end) state indices: the down-set difference
    replicas: int
    time_s: float                    # T(i -> j, r)


@dataclass(frozen=True, kw_only=True)
class ChainPartition:
    stages: tuple[ChainStage, ...]
    bottleneck_s: float              # the slowest stage or cut: seconds per minibatch in steady state

    @property
    def gpus(self) -> int:
        return sum(s.replicas for s in self.stages)

    @property
    def boundaries(self) -> tuple[int, ...]:
        return (self.stages[0].states[0],) + tuple(s.states[1] for s in self.stages)


def chain_costs(compute_s, param_bytes, cut_bytes) -> StateCosts:
    """States of a chain of n elements from per-element costs; cut_bytes[i] for i in 0..n."""
    c = np.concatenate(([0.0], np.cumsum(np.asarray(compute_s, dtype=float))))
    w = np.concatenate(([0.0], np.cumsum(np.asarray(param_bytes, dtype=float))))
    cuts = np.asarray(cut_bytes, dtype=float)
    if len(cuts) != len(c):
        raise PlanError(f"chain: {len(cuts)} cut sizes for {len(c) - 1} elements (need {len(c)})")
    n = len(c)
    return StateCosts(compute_s=c, param_bytes=w, cut_bytes=cuts,
                      nested=np.triu(np.ones((n, n), dtype=bool), 1))


def stage_time(compute_s, param_bytes, replicas: int, bandwidth_Bps: float):
    """T(i -> j, r) of the module docstring (works on scalars and arrays)."""
    allreduce = 4.0 * (replicas - 1) * np.asarray(param_bytes) / (replicas * bandwidth_Bps)
    return np.maximum(compute_s, allreduce) / replicas


def pipedream_partition(costs: StateCosts, n_gpus: int, *, bandwidth_Bps: float,
                        replication: bool = True) -> ChainPartition:
    """The optimal partition of states 0 -> last over at most `n_gpus` identical GPUs."""
    if n_gpus < 1:
        raise PlanError(f"pipedream_partition: n_gpus must be >= 1, got {n_gpus}")
    value, choice = _dp_from(costs, 0, n_gpus, bandwidth_Bps, replication)
    last = costs.n_states - 1
    m = int(np.argmin(value[last, 1:])) + 1          # fewest GPUs among the equal best
    if not np.isfinite(value[last, m]):
        raise PlanError("pipedream_partition: no partition exists (no nested chain of states)")
    stages = _backtrack(costs, choice, last, m, bandwidth_Bps)
    return ChainPartition(stages=stages, bottleneck_s=_bottleneck(costs, stages, bandwidth_Bps))


def _bottleneck(costs: StateCosts, stages, bandwidth_Bps: float) -> float:
    """The slowest stage or inter-stage cut of a partition, in float64."""
    cuts = [2.0 * costs.cut_bytes[s.states[0]] / bandwidth_Bps for s in stages[1:]]
    return float(max([s.time_s for s in stages] + cuts))


def _pair_matrices(costs: StateCosts):
    dc = costs.compute_s[None, :] - costs.compute_s[:, None]
    dw = costs.param_bytes[None, :] - costs.param_bytes[:, None]
    return dc, dw


def _dp_from(costs: StateCosts, start: int, n_gpus: int, bandwidth_Bps: float, replication: bool,
             stage_fn=None):
    """value[j, m], choice[j, m] = (i, r) for covering start -> j with exactly m GPUs.

    Tables are stored as [j, i] so the minimum over i runs along contiguous memory. Above
    FLOAT32_STATES states they are float32 (half the memory traffic); callers recompute the chosen
    partition's bottleneck in float64, so only near-ties within float32 precision can be broken
    differently.
    """
    s_count = costs.n_states
    dtype = np.float32 if s_count > FLOAT32_STATES else np.float64
    comm = 2.0 * costs.cut_bytes / bandwidth_Bps
    comm[start] = 0.0                                  # the model input is loaded, not sent
    invalid = ~costs.nested.T
    invalid[:, :start] = True
    value = np.full((s_count, n_gpus + 1), np.inf, dtype=dtype)
    value[start, 0] = 0.0
    choice = np.full((s_count, n_gpus + 1, 2), -1, dtype=np.int64)
    cost = {r: _cost_table(costs, r, bandwidth_Bps, comm, invalid, dtype, stage_fn)
            for r in (range(1, n_gpus + 1) if replication else (1,))}
    scratch = np.empty((s_count, s_count), dtype=dtype)
    rows = np.arange(s_count)
    for m in range(1, n_gpus + 1):
        for r in (r for r in cost if r <= m):
            finite = np.flatnonzero(np.isfinite(value[:, m - r]))
            if len(finite) == 0:
                continue
            if len(finite) * 4 < s_count:            # few reachable starts: look at those only
                cand = np.maximum(cost[r][:, finite], value[finite, m - r][None, :])
                pick = finite[np.argmin(cand, axis=1)]
            else:
                np.maximum(cost[r], value[None, :, m - r], out=scratch)
                pick = np.argmin(scratch, axis=1)
            best = np.maximum(cost[r][rows, pick], value[pick, m - r])
            better = best < value[:, m]
            value[better, m] = best[better]
            choice[better, m, 0] = pick[better]
            choice[better, m, 1] = r
    return value, choice


def _cost_table(costs, r, bandwidth_Bps, comm, invalid, dtype, stage_fn) -> np.ndarray:
    """[j, i]: the larger of stage i -> j on r replicas and the cut before it; inf if no stage."""
    if stage_fn is not None:
        table = np.ascontiguousarray(stage_fn(r).T, dtype=dtype)
    else:
        table = (costs.compute_s[:, None] - costs.compute_s[None, :]).astype(dtype)
        if r > 1:
            dw = (costs.param_bytes[:, None] - costs.param_bytes[None, :]).astype(dtype)
            np.maximum(table, dw * dtype(4.0 * (r - 1) / (r * bandwidth_Bps)), out=table)
            table /= dtype(r)
    np.maximum(table, comm.astype(dtype)[None, :], out=table)
    table[invalid] = np.inf
    return table


def _backtrack(costs: StateCosts, choice, last: int, m: int, bandwidth_Bps: float,
               stage_fn=None) -> tuple[ChainStage, ...]:
    stages = []
    j = last
    while m > 0:
        i, r = (int(x) for x in choice[j, m])
        dc = costs.compute_s[j] - costs.compute_s[i]
        dw = costs.param_bytes[j] - costs.param_bytes[i]
        t = stage_fn(r)[i, j] if stage_fn else stage_time(dc, dw, r, bandwidth_Bps)
        stages.append(ChainStage(states=(i, j), replicas=r, time_s=float(t)))
        j, m = i, m - r
    return tuple(reversed(stages))


def hierarchical_partition(costs: StateCosts, levels: list[tuple[int, float]], *,
                           replication: bool = True) -> ChainPartition:
    """PipeDream's hierarchical planner for `levels` = [(workers, bandwidth_Bps), ...], innermost
    first, e.g. [(4, PCIe), (2, InfiniBand)] for two servers of four GPUs.

    Level 1 solves every sub-range with up to levels[0] GPUs; at level k a worker is a whole
    level-(k-1) group whose time on a range is that level's optimum. Returns the outermost level's
    stages (replicas = groups). Cost O(states^3): meant for layer chains and moderate state counts.
    """
    if not levels:
        raise PlanError("hierarchical_partition: give at least one (workers, bandwidth) level")
    n = costs.n_states
    workers, bandwidth = levels[0]
    dc, dw = _pair_matrices(costs)
    stage_fn = lambda r: stage_time(dc, dw, r, bandwidth)
    for next_workers, next_bandwidth in levels[1:]:
        group = _all_ranges(costs, workers, bandwidth, replication, stage_fn)
        stage_fn = _outer_stage_fn(group, dw, next_bandwidth)
        workers, bandwidth = next_workers, next_bandwidth
    value, choice = _dp_from(costs, 0, workers, bandwidth, replication, stage_fn)
    m = int(np.argmin(value[n - 1, 1:])) + 1
    stages = _backtrack(costs, choice, n - 1, m, bandwidth, stage_fn)
    return ChainPartition(stages=stages, bottleneck_s=_bottleneck(costs, stages, bandwidth))


def _all_ranges(costs: StateCosts, workers: int, bandwidth: float, replication: bool, stage_fn):
    """best[i, j]: the optimum of sub-range i -> j with at most `workers` GPUs of this level."""
    n = costs.n_states
    best = np.full((n, n), np.inf)
    for start in range(n - 1):
        value, _ = _dp_from(costs, start, workers, bandwidth, replication, stage_fn)
        best[start] = value[:, 1:].min(axis=1)
    best[~costs.nested] = np.inf
    return best


def _outer_stage_fn(group: np.ndarray, dw: np.ndarray, bandwidth: float):
    """A stage of r whole groups: the group's own optimum, with the all-reduce at this level."""
    return lambda r: np.maximum(group, 4.0 * (r - 1) * dw / (r * bandwidth)) / r
