"""Closed-form throughput of a plan, used to prune before simulating (../shared/reference/hetpipe.md).

One virtual worker with Nm minibatches in flight (Little's law):
    X = min(Nm / T_roundtrip, 1 / max_k t_k)          minibatches per second
Under WSP each stage also pulls its weights from the parameter servers before every wave, and the
pull blocks it: a wave of stage k takes Nm t_k + pull_k, where pull_k shares each link with the same
stage of every other VW (WSP keeps their waves aligned), so X = Nm / max(T_roundtrip, max_k (Nm t_k +
pull_k)). Every virtual worker ends up at the pace of the slowest one, whatever D is, so the total is
n_VW * min_i X_i. Links cap that pace too: at a common pace r (minibatches per second per VW) a link
carries r times the bytes every VW sends across it per minibatch (activations forward, gradients
back, and 1/Nm of each wave's push and pull of the weights through the parameter servers), which must
stay within its bandwidth. BSP (Horovod) runs a ring all-reduce of the gradients after every wave, not
overlapped with compute.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from hetsim.cluster import host_of
from hetsim.planner.hetero import VwPartition
from hetsim.topology import Topology

__all__ = ["Estimate", "vw_rate", "wsp_estimate", "bsp_estimate", "link_loads", "pull_s", "plan_partitions"]


@dataclass(frozen=True, kw_only=True)
class Estimate:
    minibatches_per_s: float
    bottleneck: str          # what limits it: a GPU id, a link id or "all-reduce"


def vw_rate(part: VwPartition, nm: int) -> float:
    """Minibatches per second of one virtual worker on its own."""
    return min(nm / part.roundtrip_s, 1.0 / part.bottleneck_s)


def link_loads(parts: list[VwPartition], nm: int, topology: Topology) -> dict[str, float]:
    """Bytes per link when every VW completes one minibatch (default PS placement: each stage's
    weights spread evenly over the PS nodes, pushed and pulled once per wave of Nm)."""
    load: dict[str, float] = defaultdict(float)
    ps_nodes = topology.cluster.ps_nodes
    for part in parts:
        for s, nbytes in enumerate(part.transfer_bytes):
            a, b = part.gpus[s], part.gpus[s + 1]
            for src, dst in ((a, b), (b, a)):
                for link in topology.route(src, dst).links:
                    load[link] += nbytes
        if len(parts) < 2:
            continue
        for gpu, weights in zip(part.gpus, part.param_bytes):
            share = weights / len(ps_nodes) / nm
            for node in ps_nodes:
                for src, dst in ((gpu, host_of(node)), (host_of(node), gpu)):
                    for link in topology.route(src, dst).links:
                        load[link] += share
    return dict(load)


def pull_s(parts: list[VwPartition], topology: Topology) -> list[list[float]]:
    """Seconds each stage spends pulling its weights, sharing links with the same stage of every VW."""
    ps_nodes = topology.cluster.ps_nodes
    shares: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for part in parts:
        for s, (gpu, weights) in enumerate(zip(part.gpus, part.param_bytes)):
            for node in ps_nodes:
                for link in topology.route(host_of(node), gpu).links:
                    shares[s][link] += weights / len(ps_nodes)
    return [[max((shares[s][link] / topology.capacity_Bps[link] for node in ps_nodes
                  for link in topology.route(host_of(node), gpu).links), default=0.0)
             for s, gpu in enumerate(part.gpus)] for part in parts]


def wsp_estimate(parts: list[VwPartition], nm: int, topology: Topology) -> Estimate:
    pulls = pull_s(parts, topology)
    rates = [nm / max(p.roundtrip_s, max(nm * t + pull for t, pull in zip(p.stage_s, pulls[i])))
             for i, p in enumerate(parts)]
    slowest = min(range(len(parts)), key=lambda i: rates[i])
    pace, bottleneck = rates[slowest], parts[slowest].bottleneck_gpu
    for link, nbytes in sorted(link_loads(parts, nm, topology).items()):
        if nbytes > 0 and topology.capacity_Bps[link] / nbytes < pace:
            pace, bottleneck = topology.capacity_Bps[link] / nbytes, link
    return Estimate(minibatches_per_s=len(parts) * pace, bottleneck=bottleneck)


def bsp_estimate(parts: list[VwPartition], nm: int, param_bytes: int, bandwidth_Bps: float) -> Estimate:
    """Flush schedule: a wave is Nm minibatches through the slowest VW, then a ring all-reduce."""
    n = len(parts)
    wave = lambda p: p.roundtrip_s + (nm - 1) * p.bottleneck_s
    slowest = max(parts, key=wave)
    allreduce_s = 2 * (n - 1) / n * param_bytes / bandwidth_Bps if n > 1 else 0.0
    bottleneck = "all-reduce" if allreduce_s > wave(slowest) else slowest.bottleneck_gpu
    return Estimate(minibatches_per_s=n * nm / (wave(slowest) + allreduce_s), bottleneck=bottleneck)


def plan_partitions(plan, cluster, profile) -> list[VwPartition]:
    """Each virtual worker of a written plan as the estimator sees it, tensor-parallel stages
    included: a TP stage's compute is its TP time plus its activation all-reduces (a ring over the
    node's links, when the times leave them out). Transfers in and out count in full against each
    stage, as when point-to-point calls block (a stage with blocking_p2p waits out its sends)."""
    from hetsim.feasibility import plan_memory
    from hetsim.planner.hetero import VwPartition
    profile = profile.scaled_to_batch(plan.minibatch_size)
    topology = Topology(cluster)
    memory = plan_memory(plan, cluster, profile)
    parts = []
    for vw in plan.virtual_workers:
        compute, transfer, nbytes = [], [], []
        for s, stage in enumerate(vw.stages):
            lo, hi = stage.layers
            times = profile.stage_times_tp(cluster.gpu(stage.gpu).type.name, lo, hi, stage.tp)
            ring = 0.0
            if stage.tp > 1 and not times.measured_tp:
                bw = min(topology.capacity_Bps[f"{g}:out"] for g in stage.members)
                ring = 2 * 2 * (stage.tp - 1) / stage.tp * profile.stage_tp_allreduce_bytes(lo, hi) / bw
            compute.append(times.fwd_s + times.bwd_s + ring)
            if s + 1 < len(vw.stages):
                nxt = vw.stages[s + 1].gpu
                nbytes.append(profile.cut_bytes(hi))
                transfer.append(topology.route(stage.gpu, nxt).latency_s
                                + nbytes[-1] / topology.bottleneck_Bps(stage.gpu, nxt))
        k = len(vw.stages)
        stage_s = tuple(compute[s] + (transfer[s - 1] if s else 0.0) + (transfer[s] if s + 1 < k else 0.0)
                        for s in range(k))
        parts.append(VwPartition(gpus=tuple(s.gpu for s in vw.stages),
                                 boundaries=(0, *(s.layers[1] for s in vw.stages)), compute_s=tuple(compute),
                                 transfer_s=tuple(transfer), transfer_bytes=tuple(nbytes),
                                 param_bytes=tuple(profile.stage_param_bytes(*s.layers) for s in vw.stages),
                                 stage_s=stage_s, memory_bytes=tuple(memory[s.gpu].total_bytes for s in vw.stages)))
    return parts
