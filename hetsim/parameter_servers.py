"""Where WSP's parameter-server shards live and which parameters each holds (HetPipe §5).

default placement: every layer's parameters are split evenly over the PS nodes, so each node serves
1/n of every push and pull (balanced, like sliced variables over round-robin PS tasks);
local placement: shard k holds the layers of stage k of the first virtual worker and sits on that
GPU's node, so with ED/HD allocations much of the sync traffic stays inside a node.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetsim.cluster import Cluster
from hetsim.plan import Plan
from hetsim.profile import ModelProfile

__all__ = ["Shard", "ps_shards", "shard_bytes"]


@dataclass(frozen=True)
class Shard:
    node: str
    layers: tuple[int, int]
    fraction: float = 1.0          # share of each of those layers' parameters held here


def ps_shards(plan: Plan, cluster: Cluster, profile: ModelProfile) -> list[Shard]:
    if plan.sync.ps_placement == "local":
        return [Shard(cluster.gpu(s.gpu).node, s.layers) for s in plan.virtual_workers[0].stages]
    n = len(cluster.ps_nodes)
    return [Shard(node, (0, profile.n_layers), 1.0 / n) for node in cluster.ps_nodes]


def shard_bytes(profile: ModelProfile, shard: Shard, lo: int, hi: int) -> float:
    """Parameter bytes of layers [lo, hi) that live on `shard`."""
    a, b = max(lo, shard.layers[0]), min(hi, shard.layers[1])
    return profile.stage_param_bytes(a, b) * shard.fraction if b > a else 0.0
