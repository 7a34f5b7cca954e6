"""Tensor-parallel groups as single pipeline-stage devices, so the search treats the TP degree as
one more dimension (Megatron-LM keeps a TP group inside a node: its all-reduces run on every layer).

`tp_view` cuts each node's GPUs of one type into groups of `tp` (in index order; a remainder stays
idle) and returns the cluster with only each group's lead, plus the members of every group. The
planner partitions and allocates on the view, where a lead stands for its group (its stage times
and memory those of one TP member, `hetsim.planner.hetero`); plans name the whole group.
"""

from __future__ import annotations

from dataclasses import replace

from hetsim.cluster import Cluster, GpuSlot

__all__ = ["tp_view"]


def tp_view(cluster: Cluster, tp: int) -> tuple[Cluster, dict[str, tuple[str, ...]]]:
    """(the cluster with one lead GPU per TP group, lead id -> the group's GPU ids, lead first).
    Nodes with fewer than `tp` GPUs of any one type drop out (the view may have no nodes)."""
    members: dict[str, tuple[str, ...]] = {}
    nodes = []
    for node in cluster.nodes:
        by_type: dict[str, list[GpuSlot]] = {}
        for g in sorted(node.gpus, key=lambda g: g.index):
            by_type.setdefault(g.type.name, []).append(g)
        leads = []
        for same in by_type.values():
            for i in range(0, len(same) - tp + 1, tp):
                leads.append(same[i])
                members[same[i].id] = tuple(g.id for g in same[i:i + tp])
        if leads:
            nodes.append(replace(node, gpus=tuple(sorted(leads, key=lambda g: g.index))))
    kept = {n.name for n in nodes}
    # The estimate routes PS traffic to the view's nodes; a PS on a node that dropped out is
    # stood in for by every node kept (only WSP estimates use it, and TP plans cannot run WSP).
    ps = tuple(n for n in cluster.ps_nodes if n in kept) or tuple(n.name for n in nodes)
    view = replace(cluster, nodes=tuple(nodes), ps_nodes=ps,
                   paths=tuple(p for p in cluster.paths if set(p.nodes) <= kept))
    return view, members
