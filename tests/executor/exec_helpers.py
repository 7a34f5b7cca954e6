"""Small clusters and plans for executor tests: one CPU host, MLP models, gloo."""

from __future__ import annotations

from hetsim.cluster import Cluster, GpuSlot, LinkSpec, Node
from hetsim.gpu import GIB, GpuType
from hetsim.plan import Plan, StageSpec, SyncSpec, VirtualWorker

CPU = GpuType(name="cpu", display_name="CPU core", memory_bytes=8 * GIB, memory_bandwidth_Bps=1e10,
              peak_fp32_flops=1e11, peak_fp16_flops=1e11, sources=("this host",))


def host(n_devices: int, cores: int | None = 2) -> Cluster:
    slots = tuple(GpuSlot(id=f"host/gpu{i}", node="host", index=i, type=CPU) for i in range(n_devices))
    link = LinkSpec(kind="loopback", bandwidth_Bps=5e9, latency_s=2e-5)
    return Cluster(name="cpu_host", nodes=(Node(name="host", gpus=slots, intra_link=link, shared_cores=cores),),
                   network=link, ps_nodes=("host",))


def mlp_plan(vws: list[list[int]], *, nm: int, schedule: str, sync: SyncSpec = SyncSpec(),
             batch: int = 16) -> Plan:
    """`vws[v]` = the cuts of VW v over the 9 layers of modelzoo's mlp, e.g. [0, 4, 9]."""
    gpu = iter(range(100))
    return Plan(name="test", model="mlp", minibatch_size=batch, nm=nm, schedule=schedule, sync=sync,
                virtual_workers=tuple(
                    VirtualWorker(name=f"vw{v}", stages=tuple(
                        StageSpec(gpu=f"host/gpu{next(gpu)}", layers=(cuts[i], cuts[i + 1]))
                        for i in range(len(cuts) - 1)))
                    for v, cuts in enumerate(vws)))


# A GPT small enough for CI: 2 blocks, so 5 layers (embed, blocks_0, blocks_1, ln_f, head).
TINY_GPT = {"n_layer": 2, "d_model": 32, "n_head": 2, "seq_len": 16, "vocab_size": 64}


def gpt_plan(cuts: list[int], *, nm: int, schedule: str, batch: int = 8) -> Plan:
    """One VW of gpt2-small (with TINY_GPT's overrides) cut at `cuts`, e.g. [0, 3, 5]."""
    stages = tuple(StageSpec(gpu=f"host/gpu{i}", layers=(cuts[i], cuts[i + 1])) for i in range(len(cuts) - 1))
    return Plan(name="gpt_test", model="gpt2-small", minibatch_size=batch, nm=nm, schedule=schedule,
                sync=SyncSpec(), virtual_workers=(VirtualWorker(name="vw0", stages=stages),))
