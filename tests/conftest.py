"""Builders for small synthetic clusters, profiles and plans, so closed forms are easy to state."""

from __future__ import annotations

import math

from hetsim.cluster import Cluster, GpuSlot, LinkSpec, Node
from hetsim.data import pipedream_profiles
from hetsim.gpu import GIB, GpuType
from hetsim.plan import Plan, StageSpec, SyncSpec, VirtualWorker
from hetsim.profile import LayerProfile, ModelProfile

PIPEDREAM_PROFILES = pipedream_profiles()     # shipped with the package (gpu_profiles/pipedream)


# Two RTX 2060s on PCIe in one node: the smallest cluster file the CLI tests write.
TINY_CLUSTER_YAML = """
name: tiny
network: {kind: ethernet, bandwidth_gbit_s: 10}
nodes:
  - name: node0
    gpus: [{type: rtx-2060, count: 2}]
    intra_link: {kind: pcie, gen: 3, lanes: 16}
"""


def gpu_type(name: str = "test-gpu", memory_gib: float = 16.0) -> GpuType:
    return GpuType(name=name, display_name=name, memory_bytes=int(memory_gib * GIB),
                   memory_bandwidth_Bps=1e12, peak_fp32_flops=1e13, peak_fp16_flops=1e14,
                   sources=("synthetic test type",))


def cluster(gpus_per_node: list[int], *, intra_Bps: float = 1e18, net_Bps: float = 1e18,
            latency_s: float = 0.0, types: list[GpuType] | None = None, shared_cores=None,
            colocated_work: float = 1.0, copy_cores: int | None = None) -> Cluster:
    """Nodes node0.. with the given GPU counts; node i uses types[i] (default one test type)."""
    nodes = []
    for i, count in enumerate(gpus_per_node):
        t = types[i] if types else gpu_type()
        name = f"node{i}"
        slots = tuple(GpuSlot(id=f"{name}/gpu{j}", node=name, index=j, type=t) for j in range(count))
        nodes.append(Node(name=name, gpus=slots, shared_cores=shared_cores, colocated_work=colocated_work,
                          copy_cores=copy_cores,
                          intra_link=LinkSpec(kind="pcie", bandwidth_Bps=intra_Bps, latency_s=latency_s)))
    return Cluster(name="test", nodes=tuple(nodes), ps_nodes=tuple(n.name for n in nodes),
                   network=LinkSpec(kind="ethernet", bandwidth_Bps=net_Bps, latency_s=latency_s))


def profile(n_layers: int, fwd_s: float | list[float], bwd_s: float | list[float], *,
            out_bytes: int = 0, param_bytes: int = 0, types: tuple[str, ...] = ("test-gpu",),
            batch: int = 1) -> ModelProfile:
    fwd = fwd_s if isinstance(fwd_s, list) else [fwd_s] * n_layers
    bwd = bwd_s if isinstance(bwd_s, list) else [bwd_s] * n_layers
    layers = tuple(LayerProfile(name=f"l{i}", kind="Linear", param_bytes=param_bytes, output_bytes=out_bytes,
                                fwd_s={t: fwd[i] for t in types}, bwd_s={t: bwd[i] for t in types})
                   for i in range(n_layers))
    return ModelProfile(model="synthetic", batch_size=batch, layers=layers,
                        edges=tuple((i, i + 1) for i in range(n_layers - 1)), input_bytes=out_bytes,
                        source="synthetic test profile")


def plan(vws: list[list[str]], splits: list[int], *, nm: int, schedule: str = "1f1b",
         sync: SyncSpec = SyncSpec(), minibatch: int = 1) -> Plan:
    """Every VW uses the same layer boundaries `splits` (e.g. [0, 1, 2] = two one-layer stages)."""
    return Plan(name="test", model="synthetic", minibatch_size=minibatch, nm=nm, schedule=schedule,
                sync=sync, virtual_workers=tuple(
                    VirtualWorker(name=f"vw{v}", stages=tuple(
                        StageSpec(gpu=g, layers=(splits[i], splits[i + 1])) for i, g in enumerate(gpus)))
                    for v, gpus in enumerate(vws)))
