"""Antichain-DAG partitioning for branching models (ResNet, Inception, DenseNet).

The construction of PipeDream's planner (SOSP'19, section 3.1; ../shared/reference/pipedream.md),
which the antichain paper (../shared/reference/antichain.md) reuses: an antichain is a set of layers
none of which precedes another; *augmenting* it adds every predecessor whose output is still consumed
past the antichain. Each augmented antichain stands for a state, the down-set of everything computed
so far, and the bytes crossing its cut are the outputs of the augmented antichain's members. From a
state the next ones advance one member to one of its successors (taking along that successor's
missing predecessors). The states, sorted topologically, are the sequence PipeDream's dynamic
program cuts into stages (`hetsim.planner.chain`); a stage runs between two *nested* states.

Down-sets are Python integers used as bit sets, so advancing a state costs a few big-integer
operations; the cost tables are built once for all states with numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hetsim.errors import PlanError
from hetsim.planner.chain import ChainPartition, StateCosts, pipedream_partition
from hetsim.profile import ModelProfile

__all__ = ["FAMILIES", "AntichainStates", "antichain_states", "antichain_costs", "antichain_partition",
           "stage_layers", "layer_order"]


FAMILIES = ("all", "one-partial-branch", "whole-branches")


@dataclass(frozen=True)
class AntichainStates:
    """States in topological order; `members[s]` is a bool row per layer (in state s's down-set).

    `family` says which states were enumerated (see `antichain_states`).
    """

    masks: tuple[int, ...]
    members: np.ndarray
    family: str


@dataclass(frozen=True)
class _Graph:
    n: int
    succ_mask: tuple[int, ...]
    closure: tuple[int, ...]          # a layer and all its predecessors
    sources: int
    link_child: int                   # layers whose only predecessor has them as its only successor
    branch_end: tuple[int, ...]       # mid-branch layer -> the last layer of its branch chain


def _graph(profile: ModelProfile) -> _Graph:
    n = profile.n_layers
    preds: list[list[int]] = [[] for _ in range(n)]
    succs: list[list[int]] = [[] for _ in range(n)]
    for src, dst in profile.edges:
        preds[dst].append(src)
        succs[src].append(dst)
    closure = [0] * n
    for v in range(n):                     # layers are in topological order
        c = 1 << v
        for p in preds[v]:
            c |= closure[p]
        closure[v] = c
    child = [len(preds[v]) == 1 and len(succs[preds[v][0]]) == 1 for v in range(n)]
    end = list(range(n))
    for v in reversed(range(n)):           # follow a branch chain while it stays a chain
        if len(succs[v]) == 1 and child[succs[v][0]]:
            end[v] = end[succs[v][0]]
    in_branch = [False] * n                # on a chain that starts at a fork
    for v in range(n):
        in_branch[v] = (child[v] and in_branch[preds[v][0]]) or \
            (len(preds[v]) == 1 and len(succs[preds[v][0]]) > 1)
    return _Graph(n=n, succ_mask=tuple(sum(1 << d for d in succs[v]) for v in range(n)),
                  closure=tuple(closure), sources=sum(1 << v for v in range(n) if not preds[v]),
                  link_child=sum(1 << v for v in range(n) if child[v]),
                  branch_end=tuple(end[v] if in_branch[v] else v for v in range(n)))


def antichain_states(profile: ModelProfile, *, budget: int = 2000,
                     family: str | None = None) -> AntichainStates:
    """The states reachable from the empty one by advancing the augmented antichain one layer.

    family "all" is PipeDream's full enumeration. Parallel branches multiply the states (Inception-v3
    has over 200,000), so without `family` the richest family within `budget` states is used:
    "one-partial-branch" keeps the states in which at most one branch of a parallel region is half
    done; "whole-branches" treats each branch (a chain that starts at a fork) as one step.
    """
    graph = _graph(profile)
    for name in ([family] if family else FAMILIES):
        if name not in FAMILIES:
            raise PlanError(f"antichain: family must be one of {', '.join(FAMILIES)}, not {name!r}")
        seen = _enumerate(graph, name, None if family else budget)
        if seen is not None:
            masks = tuple(sorted(seen, key=lambda m: (m.bit_count(), m)))
            return AntichainStates(masks=masks, members=_bool_rows(masks, graph.n), family=name)
    raise PlanError(f"antichain: {profile.model} has more than {budget} states even with whole "
                    "branches as steps; partition its layer chain instead (hetsim.planner.hetero)")


def _enumerate(g: _Graph, family: str, budget: int | None) -> dict[int, int] | None:
    """state -> layers that may join it next (successors of its members), or None over budget."""
    seen = {0: g.sources}
    frontier = [0]
    while frontier:
        nxt = []
        for state in frontier:
            candidates = seen[state] & ~state
            while candidates:
                low = candidates & -candidates
                candidates ^= low
                v = low.bit_length() - 1
                if family == "whole-branches":
                    v = g.branch_end[v]
                grown = state | g.closure[v]
                if grown in seen:
                    continue
                reach = _advance(seen[state], grown & ~state, g.succ_mask)
                if family == "one-partial-branch" and _partial_branches(reach & ~grown, g) > 1:
                    continue
                seen[grown] = reach
                nxt.append(grown)
        if budget is not None and len(seen) > budget:
            return None
        frontier = nxt
    return seen


def _partial_branches(next_layers: int, g: _Graph) -> int:
    """Branches stopped half way: next layers whose only predecessor feeds only them. With one next
    layer the cut is on the trunk, not inside a parallel region."""
    return 0 if next_layers.bit_count() <= 1 else (next_layers & g.link_child).bit_count()


def _advance(reachable: int, added: int, succ_mask) -> int:
    while added:
        low = added & -added
        added ^= low
        reachable |= succ_mask[low.bit_length() - 1]
    return reachable


def _bool_rows(masks: tuple[int, ...], n: int) -> np.ndarray:
    width = (n + 7) // 8
    raw = np.frombuffer(b"".join(m.to_bytes(width, "little") for m in masks), dtype=np.uint8)
    return np.unpackbits(raw.reshape(len(masks), width), axis=1, bitorder="little")[:, :n].astype(bool)


def antichain_costs(profile: ModelProfile, states: AntichainStates, gpu_type: str) -> StateCosts:
    """Cumulative compute, weights and cut bytes of every state, and which states nest."""
    profile.require_gpu_type(gpu_type)
    member = states.members.astype(np.float64)
    times = np.array([l.fwd_s[gpu_type] + l.bwd_s[gpu_type] for l in profile.layers])
    params = np.array([l.param_bytes for l in profile.layers], dtype=np.float64)
    outputs = np.array([l.output_bytes for l in profile.layers], dtype=np.float64)
    src = np.array([e[0] for e in profile.edges], dtype=np.int64)
    dst = np.array([e[1] for e in profile.edges], dtype=np.int64)
    crossing = states.members[:, src] & ~states.members[:, dst]          # state x edge
    live = np.zeros(states.members.shape, dtype=bool)
    for e in np.flatnonzero(crossing.any(axis=0)):
        live[:, src[e]] |= crossing[:, e]
    cut = live.astype(np.float64) @ outputs
    cut[0] = profile.input_bytes
    outside = (~states.members).astype(np.float32)
    # i nests in j when no layer of i lies outside j (counts are exact in float32 below 2^24).
    nested = (states.members.astype(np.float32) @ outside.T) == 0
    np.fill_diagonal(nested, False)
    return StateCosts(compute_s=member @ times, param_bytes=member @ params, cut_bytes=cut,
                      nested=nested)


def antichain_partition(profile: ModelProfile, n_gpus: int, *, gpu_type: str, bandwidth_Bps: float,
                        replication: bool = True, family: str | None = None
                        ) -> tuple[ChainPartition, AntichainStates]:
    """PipeDream's optimum over the antichain states on `n_gpus` identical GPUs."""
    states = antichain_states(profile, family=family)
    costs = antichain_costs(profile, states, gpu_type)
    return pipedream_partition(costs, n_gpus, bandwidth_Bps=bandwidth_Bps,
                               replication=replication), states


def stage_layers(partition: ChainPartition, states: AntichainStates) -> list[list[int]]:
    """The layers each stage runs: the difference of its two states' down-sets."""
    rows = states.members
    return [sorted(np.flatnonzero(rows[j] & ~rows[i]).tolist()) for i, j in
            (s.states for s in partition.stages)]


def layer_order(partition: ChainPartition, states: AntichainStates) -> list[int]:
    """A topological order of the layers in which every stage is a contiguous range."""
    return [v for layers in stage_layers(partition, states) for v in layers]
