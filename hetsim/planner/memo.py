"""Partitions shared by virtual workers of the same shape.

A virtual worker's best partition depends only on its GPU types, how they sit in nodes and the links
between them, not on node names: the 48 four-GPU groups of twelve identical V100 nodes are one
partition problem, solved once and relabelled onto each group. A *shape* lists the VW's nodes in a
canonical order (by node signature, then name), each as its signature (intra-node link, interface,
per-GPU rails) and the types of the VW's GPUs on it, plus any slower node-to-node paths between them.
"""

from __future__ import annotations

from dataclasses import replace

from hetsim.cluster import Cluster, GpuSlot
from hetsim.errors import PlanError
from hetsim.memory import MemorySettings
from hetsim.planner.hetero import VwPartition, partition_aligned, partition_vw
from hetsim.profile import ModelProfile
from hetsim.topology import Topology

__all__ = ["PartitionMemo", "vw_shape"]


def vw_shape(cluster: Cluster, slots: list[GpuSlot]) -> tuple[tuple, list[GpuSlot]]:
    """(shape key, the slots in canonical order): two groups with equal keys are the same problem,
    and the i-th slot of one plays the part of the i-th slot of the other."""
    by_node: dict[str, list[GpuSlot]] = {}
    for s in slots:
        by_node.setdefault(s.node, []).append(s)
    signature = {}
    for name, members in by_node.items():
        node = cluster.node(name)
        signature[name] = ((node.intra_link, node.nic or cluster.network, node.nic_per_gpu),
                           tuple(sorted(g.type.name for g in members)))
    order = sorted(by_node, key=lambda n: (repr(signature[n]), n))
    canonical = [g for n in order for g in sorted(by_node[n], key=lambda g: (g.type.name, g.index))]
    paths = tuple((order.index(p.nodes[0]), order.index(p.nodes[1]), p.link) for p in cluster.paths
                  if p.nodes[0] in by_node and p.nodes[1] in by_node)
    return (tuple(signature[n] for n in order), tuple(sorted(paths, key=repr))), canonical


class PartitionMemo:
    """`partition_vw` once per (shape, Nm, schedule); the profile's cost tables shared by all calls.
    With `tp` > 1 every GPU of `cluster` leads a tensor-parallel group of `tp` (`tp_view`); `memory`
    is how training is set up (optimizer, precision, recomputation), the same for every partition."""

    def __init__(self, cluster: Cluster, profile: ModelProfile, topology: Topology, tp: int = 1,
                 memory: MemorySettings | None = None):
        self.cluster, self.profile, self.topology, self.tp = cluster, profile, topology, tp
        self.memory = memory or MemorySettings()
        self._slot = {g.id: g for g in cluster.gpus}
        self._found: dict[tuple, tuple[list[GpuSlot], VwPartition | PlanError]] = {}
        self._tables: dict = {}
        self._by_group: dict[tuple, VwPartition | PlanError] = {}    # many allocations share groups

    def slot(self, gpu_id: str) -> GpuSlot:
        return self._slot[gpu_id]

    def partition(self, group: tuple[str, ...], nm: int, schedule: str) -> VwPartition:
        """The best partition of the VW on GPUs `group`; raises PlanError when nothing fits."""
        key = (group, nm, schedule)
        if key not in self._by_group:
            try:
                self._by_group[key] = self._partition(group, nm, schedule)
            except PlanError as exc:
                self._by_group[key] = exc
        found = self._by_group[key]
        if isinstance(found, PlanError):
            raise found
        return found

    def _partition(self, group: tuple[str, ...], nm: int, schedule: str) -> VwPartition:
        shape, canonical = vw_shape(self.cluster, [self._slot[g] for g in group])
        key = (shape, nm, schedule)
        if key not in self._found:
            try:
                found = partition_vw(self.profile, canonical, self.topology, nm=nm, schedule=schedule,
                                     memory=self.memory, cache=self._tables, tp=self.tp)
            except PlanError as exc:
                found = exc
            self._found[key] = (canonical, found)
        first, found = self._found[key]
        if isinstance(found, PlanError):
            raise found
        if first == canonical:
            return found
        mapping = {a.id: b.id for a, b in zip(first, canonical)}
        return replace(found, gpus=tuple(mapping[g] for g in found.gpus))

    def aligned(self, groups: tuple[tuple[str, ...], ...], nm: int, schedule: str) -> list[VwPartition]:
        """One set of layer ranges for the VWs on `groups` (sync bsp and sdpipe), each VW on its GPUs
        in the order of its own best partition; VWs of one shape are one lane of the DP, in the
        same positions (both are relabellings of one partition), so they share its description."""
        own = [self.partition(g, nm, schedule) for g in groups]
        shapes = [vw_shape(self.cluster, [self._slot[g] for g in group])[0] for group in groups]
        first: dict[tuple, VwPartition] = {}
        for shape, part in zip(shapes, own):
            first.setdefault(shape, part)
        lanes = [[self._slot[g] for g in part.gpus] for part in first.values()]
        described = dict(zip(first, partition_aligned(self.profile, lanes, self.topology, nm=nm,
                                                      schedule=schedule, memory=self.memory,
                                                      cache=self._tables, tp=self.tp)))
        out = []
        for shape, part in zip(shapes, own):
            mapping = dict(zip(first[shape].gpus, part.gpus))
            out.append(replace(described[shape], gpus=tuple(mapping[g] for g in described[shape].gpus)))
        return out
