"""Resource allocation: which GPUs form each virtual worker (HetPipe, ATC'20, section 6.2).

NP (node partition): each node's GPUs form one virtual worker, so VWs differ in speed.
ED (equal distribution): virtual worker i takes GPU i of every node, so VWs are identical and
    activations cross the network.
HD (hybrid distribution): nodes are paired fastest with slowest and each pair is split into virtual
    workers that take half of each node's GPUs: VWs of similar speed with half the traffic in a node.
auto: every allocation above, each node split into smaller NP groups, one GPU per VW (data
    parallelism) and the same shapes on the nodes left after dropping the slowest nodes one by one.
An allocation lists GPU ids per VW; the GPU order inside a VW is the partitioner's choice.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetsim.cluster import Cluster, Node
from hetsim.errors import PlanError

__all__ = ["POLICIES", "Allocation", "allocate", "node_speed"]

POLICIES = ("NP", "ED", "HD", "auto")


@dataclass(frozen=True, kw_only=True)
class Allocation:
    policy: str                                 # e.g. "NP", "ED", "HD", "NP/2", "DP", "ED-node3"
    groups: tuple[tuple[str, ...], ...]         # GPU ids of each virtual worker

    @property
    def n_gpus(self) -> int:
        return sum(len(g) for g in self.groups)


def node_speed(node: Node) -> float:
    """Peak FP32 FLOP/s of the node's GPUs: the order HD pairs nodes in."""
    return sum(g.type.peak_fp32_flops for g in node.gpus)


def allocate(cluster: Cluster, policy: str) -> list[Allocation]:
    """The allocations a policy stands for (one, except for auto)."""
    nodes = list(cluster.nodes)
    if policy == "NP":
        return [_np(nodes)]
    if policy == "ED":
        return [_ed(nodes, "ED")]
    if policy == "HD":
        return [_hd(nodes)]
    if policy == "auto":
        return _auto(nodes)
    raise PlanError(f"policy {policy!r}: choose from {', '.join(POLICIES)}")


def _np(nodes: list[Node], parts: int = 1, label: str = "NP") -> Allocation:
    groups = []
    for node in nodes:
        ids = [g.id for g in node.gpus]
        size = max(1, len(ids) // parts)
        groups += [tuple(ids[i:i + size]) for i in range(0, size * (len(ids) // size), size)]
    return Allocation(policy=label, groups=tuple(groups))


def _ed(nodes: list[Node], label: str, n_vw: int | None = None) -> Allocation:
    """VW i takes an equal share of every node's GPUs; GPUs beyond an equal share stay idle."""
    n_vw = n_vw or min(len(n.gpus) for n in nodes)
    per_node = [len(n.gpus) // n_vw for n in nodes]
    groups = tuple(tuple(n.gpus[v * k + j].id for n, k in zip(nodes, per_node) for j in range(k))
                   for v in range(n_vw))
    return Allocation(policy=label, groups=groups)


def _hd(nodes: list[Node]) -> Allocation:
    ranked = sorted(nodes, key=lambda n: (-node_speed(n), n.name))
    groups = []
    while ranked:
        pair = [ranked.pop(0)] + ([ranked.pop()] if ranked else [])
        n_vw = max(1, min(len(n.gpus) for n in pair) // 2)
        groups += _ed(pair, "HD", n_vw).groups
    return Allocation(policy="HD", groups=tuple(groups))


def _auto(nodes: list[Node]) -> list[Allocation]:
    out: list[Allocation] = []
    ranked = sorted(nodes, key=lambda n: (-node_speed(n), n.name))
    for kept in range(len(nodes), 0, -1):
        subset = [n for n in nodes if n in ranked[:kept]]
        suffix = "" if kept == len(nodes) else "-" + "-".join(n.name for n in ranked[kept:])
        shapes = [_np(subset, 1, "NP"), _hd(subset), _np(subset, 10**9, "DP")]
        smallest = min(len(n.gpus) for n in subset)
        shapes += [_ed(subset, "ED" if v == smallest else f"ED/{v}", v)
                   for v in range(1, smallest + 1) if smallest % v == 0]
        shapes += [_np(subset, parts, f"NP/{parts}") for parts in (2, 4) if parts < smallest]
        for shape in shapes:
            labelled = Allocation(policy=shape.policy + suffix, groups=shape.groups)
            if all(labelled.groups != a.groups for a in out):
                out.append(labelled)
    return out
