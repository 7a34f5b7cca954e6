"""Clusters: nodes, their GPUs, the links inside a node and the network between nodes.

Loaded from gpu_profiles/clusters/*.yaml; bandwidths are stored in bytes/s and latencies in seconds.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from hetsim.data import resolve
from hetsim.errors import PlanError, SpecError
from hetsim.fields import Fields, dump_yaml
from hetsim.gpu import GpuType, gpu_type_document, gpu_type_from_fields, load_gpu_types
from hetsim.outputs import write_text
from hetsim.units import in_units

__all__ = ["LinkSpec", "GpuSlot", "Node", "NodePath", "Cluster", "load_cluster", "save_cluster", "cluster_document",
           "host_of"]

# Usable bytes/s per lane and direction after line encoding (PCI-SIG base specifications).
PCIE_LANE_Bps = {1: 0.25e9, 2: 0.5e9, 3: 0.985e9, 4: 1.969e9, 5: 3.938e9, 6: 7.563e9}
_LINK_KINDS = {"pcie", "nvlink", "infiniband", "ethernet", "loopback"}
# Far more than any server holds (a rack-scale NVLink domain has 72): a larger count is a typo.
MAX_GPUS_PER_NODE = 1024


@dataclass(frozen=True, kw_only=True)
class LinkSpec:
    """One kind of link; `bandwidth_Bps` is per direction (links are full duplex)."""

    kind: str
    bandwidth_Bps: float
    latency_s: float
    # The fixed cost of one collective call among GPUs this link joins (its launch, the members' entry
    # and wake-up), paid once per call on top of the per-message latency of each of its ring's steps.
    collective_latency_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class GpuSlot:
    """One physical GPU of the cluster, e.g. id "node1/gpu2"."""

    id: str
    node: str
    index: int
    type: GpuType


@dataclass(frozen=True, kw_only=True)
class Node:
    name: str
    gpus: tuple[GpuSlot, ...]
    intra_link: LinkSpec
    # When set, the node's devices are processes sharing this many CPU cores (see docs/executor.md);
    # a fraction where other load leaves them part of a core (hetsim validate measures it).
    shared_cores: float | None = None
    # With shared_cores: compute there costs this many times its profiled CPU work, because the
    # processes evict each other's data from the per-core caches (executor.colocation measures it).
    colocated_work: float = 1.0
    # With shared_cores: the cores that copy messages between the processes (gloo through host
    # memory), where they are not the shared ones that compute: ranks sharing one GPU compute on it
    # while the host's cores move their messages. None: the shared cores do both (CPU ranks).
    copy_cores: int | None = None
    # This node's own network interface, where it differs from the cluster's `network` (a node on a
    # slower NIC or switch port); None: the cluster's.
    nic: LinkSpec | None = None
    # Each GPU has a network interface of its own (GPUDirect rails: DGX, GH200 nodes) with that
    # bandwidth, rather than all sharing one.
    nic_per_gpu: bool = False


@dataclass(frozen=True, kw_only=True)
class NodePath:
    """A path between two nodes slower than their interfaces (a WAN hop, a congested switch): traffic
    between them also crosses this link, one capacity per direction."""

    nodes: tuple[str, str]
    link: LinkSpec


@dataclass(frozen=True, kw_only=True)
class Cluster:
    name: str
    nodes: tuple[Node, ...]
    network: LinkSpec
    ps_nodes: tuple[str, ...]
    description: str = ""
    paths: tuple[NodePath, ...] = ()

    @cached_property
    def gpus(self) -> tuple[GpuSlot, ...]:
        return tuple(g for node in self.nodes for g in node.gpus)

    @cached_property
    def _gpu_by_id(self) -> dict[str, GpuSlot]:
        # Planner and simulator look GPUs up per stage; a scan made a 512-GPU plan check quadratic.
        return {g.id: g for g in self.gpus}

    def gpu(self, gpu_id: str) -> GpuSlot:
        if gpu_id in self._gpu_by_id:
            return self._gpu_by_id[gpu_id]
        near = difflib.get_close_matches(gpu_id, [g.id for g in self.gpus], n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise PlanError(f"cluster {self.name}: no GPU {gpu_id!r} (GPUs are named node/gpuN){hint}")

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise PlanError(f"cluster {self.name}: no node {name!r}")

    def nic(self, node: str) -> LinkSpec:
        """The network interface of a node: its own, else the cluster's."""
        return self.node(node).nic or self.network

    @property
    def gpu_types(self) -> dict[str, GpuType]:
        return {g.type.name: g.type for g in self.gpus}


def host_of(node: str) -> str:
    """The endpoint name of a node's host memory (where parameter servers live)."""
    return f"{node}/host"


def load_cluster(path: str | Path, gpu_types: dict[str, GpuType] | None = None) -> Cluster:
    """Load a cluster file (or the name of a shipped one), validating every field once."""
    f = Fields.load(resolve("cluster", path))
    f.reject_unknown({"name", "description", "network", "nodes", "parameter_servers", "gpu_types", "paths"})
    types = dict(gpu_types) if gpu_types is not None else load_gpu_types()
    inline_names: list[str] = []
    for i, inline in enumerate(f.records("gpu_types", [])):
        gpu = gpu_type_from_fields(inline)
        if gpu.name in inline_names:
            raise f.error(f"gpu_types[{i}].name", f"{gpu.name!r} is defined twice in this file")
        inline_names.append(gpu.name)
        types[gpu.name] = gpu
    nodes = tuple(_node(n, types) for n in f.records("nodes"))
    names = [n.name for n in nodes]
    for i, name in enumerate(names):
        if names.index(name) != i:
            raise f.error(f"nodes[{i}].name", f"{name!r} is used by another node")
    ps_nodes = _ps_nodes(f, names)
    paths = tuple(_path(p, names) for p in f.records("paths", []))
    return Cluster(name=f.text("name"), description=f.text("description", ""), nodes=nodes,
                   network=_link(f.sub("network")), ps_nodes=tuple(ps_nodes), paths=paths)


def _ps_nodes(f: Fields, names: list[str]) -> list[str]:
    """The nodes holding WSP's parameter-server shards: all by default, and never none (a WSP plan
    would then run with no synchronisation at all)."""
    ps_nodes = f.list("parameter_servers", names)
    if not ps_nodes:
        raise f.error("parameter_servers", "must name at least one node (or leave it out: a server on every node)")
    for i, name in enumerate(ps_nodes):
        if name not in names:
            raise f.error(f"parameter_servers[{i}]", f"no node named {name!r}")
        if ps_nodes.index(name) != i:
            raise f.error(f"parameter_servers[{i}]", f"{name!r} is named twice")
    return ps_nodes


def _path(f: Fields, names: list[str]) -> NodePath:
    ends = f.list("nodes")
    if len(ends) != 2 or ends[0] == ends[1] or not all(e in names for e in ends):
        raise f.error("nodes", f"expected two different node names of this cluster, got {ends!r}")
    link = {k: v for k, v in f.data.items() if k != "nodes"}
    link.setdefault("kind", "ethernet")
    return NodePath(nodes=(ends[0], ends[1]), link=_link(Fields(link, f.source, f.where())))


def _node(f: Fields, types: dict[str, GpuType]) -> Node:
    f.reject_unknown({"name", "gpus", "intra_link", "shared_cores", "colocated_work", "copy_cores", "network",
                      "nic_per_gpu"})
    name = f.text("name")
    if "/" in name or not name.strip():
        raise f.error("name", f"{name!r}: a node's name is some text without '/' (GPU ids are node/gpuN)")
    slots: list[GpuSlot] = []
    for g in f.records("gpus"):
        g.reject_unknown({"type", "count"})
        type_name = g.text("type")
        if type_name not in types:
            near = difflib.get_close_matches(type_name, list(types), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else f" (known: {', '.join(sorted(types))})"
            raise g.error("type", f"unknown GPU type {type_name!r}{hint}")
        count = g.number("count", 1, positive=True, integer=True)
        if len(slots) + count > MAX_GPUS_PER_NODE:
            raise g.error("count", f"{name} would hold {len(slots) + count} GPUs, more than the "
                          f"{MAX_GPUS_PER_NODE} a node may have here")
        for _ in range(count):
            idx = len(slots)
            slots.append(GpuSlot(id=f"{name}/gpu{idx}", node=name, index=idx, type=types[type_name]))
    cores = f.number("shared_cores", None, positive=True)
    colocated = f.number("colocated_work", 1.0, positive=True)
    if colocated != 1.0 and cores is None:
        raise f.error("colocated_work", "applies to processes sharing cores; set shared_cores too")
    copy_cores = f.number("copy_cores", None, positive=True, integer=True)
    if copy_cores is not None and cores is None:
        raise f.error("copy_cores", "applies to processes sharing cores; set shared_cores too")
    nic = _link(f.sub("network")) if f.has("network") else None
    per_gpu = f.flag("nic_per_gpu")
    return Node(name=name, gpus=tuple(slots), intra_link=_link(f.sub("intra_link")), shared_cores=cores,
                colocated_work=colocated, copy_cores=copy_cores, nic=nic, nic_per_gpu=per_gpu)


def save_cluster(cluster: Cluster, path: str | Path) -> None:
    """Write the cluster as a file that load_cluster reads back equal (cluster_document)."""
    write_text(path, dump_yaml(cluster_document(cluster), sort_keys=False, width=120))


def cluster_document(cluster: Cluster) -> dict:
    """The cluster as a file that load_cluster reads back to an equal cluster, bit for bit
    (hetsim.units.in_units), its GPU types inline so that it needs no other file."""
    types: dict[str, GpuType] = {}
    for slot in cluster.gpus:
        if types.setdefault(slot.type.name, slot.type) != slot.type:
            raise SpecError(f"cluster {cluster.name}: two different GPU types are named {slot.type.name!r}; "
                            "a file can hold only one")
    doc = {"name": cluster.name, "description": cluster.description,
           "gpu_types": [gpu_type_document(t) for t in types.values()],
           "network": _link_document(cluster.network), "nodes": [_node_document(n) for n in cluster.nodes],
           "parameter_servers": list(cluster.ps_nodes)}
    if cluster.paths:
        doc["paths"] = [{"nodes": list(p.nodes), **_link_document(p.link)} for p in cluster.paths]
    return doc


def _node_document(node: Node) -> dict:
    gpus: list[dict] = []
    for slot in node.gpus:                       # runs of one type, in slot order
        if gpus and gpus[-1]["type"] == slot.type.name:
            gpus[-1]["count"] += 1
        else:
            gpus.append({"type": slot.type.name, "count": 1})
    doc = {"name": node.name, "gpus": gpus, "intra_link": _link_document(node.intra_link)}
    if node.shared_cores is not None:
        doc["shared_cores"] = node.shared_cores
        if node.colocated_work != 1.0:
            doc["colocated_work"] = node.colocated_work
        if node.copy_cores is not None:
            doc["copy_cores"] = node.copy_cores
    if node.nic is not None:
        doc["network"] = _link_document(node.nic)
    if node.nic_per_gpu:
        doc["nic_per_gpu"] = True
    return doc


def _link_document(link: LinkSpec) -> dict:
    doc = {"kind": link.kind, "bandwidth_GBps": in_units(link.bandwidth_Bps, 1e9),
           "latency_us": in_units(link.latency_s, 1e-6)}
    if link.collective_latency_s:
        doc["collective_latency_us"] = in_units(link.collective_latency_s, 1e-6)
    return doc


def _link(f: Fields) -> LinkSpec:
    f.reject_unknown({"kind", "gen", "lanes", "bandwidth_GBps", "bandwidth_gbit_s", "latency_us",
                      "collective_latency_us"})
    kind = f.text("kind", choices=_LINK_KINDS)
    given = [k for k in ("bandwidth_GBps", "bandwidth_gbit_s") if f.has(k)]
    if len(given) == 2 or (given and (f.has("gen") or f.has("lanes"))):
        rest = given[1] if len(given) == 2 else ("gen" if f.has("gen") else "lanes")
        raise f.error(rest, f"give the link's bandwidth once: {given[0]} and {rest} both set it")
    if not given and kind != "pcie" and (f.has("gen") or f.has("lanes")):
        raise f.error("gen" if f.has("gen") else "lanes", f"only a pcie link takes gen and lanes, not a {kind} one")
    if f.has("bandwidth_GBps"):
        bandwidth = f.number("bandwidth_GBps", positive=True) * 1e9
    elif f.has("bandwidth_gbit_s"):
        bandwidth = f.number("bandwidth_gbit_s", positive=True) * 1e9 / 8
    elif kind == "pcie":
        gen = f.number("gen", integer=True)
        if gen not in PCIE_LANE_Bps:
            raise f.error("gen", f"PCIe generation {gen} unknown (1-6)")
        bandwidth = PCIE_LANE_Bps[gen] * f.number("lanes", 16, positive=True, integer=True)
    else:
        raise f.error("bandwidth_GBps", f"missing (a {kind} link needs bandwidth_GBps or bandwidth_gbit_s)")
    return LinkSpec(kind=kind, bandwidth_Bps=bandwidth, latency_s=f.number("latency_us", 0.0, nonnegative=True) * 1e-6,
                    collective_latency_s=f.number("collective_latency_us", 0.0, nonnegative=True) * 1e-6)
