"""Closed-form throughput of a plan, used to prune before simulating (../shared/reference/hetpipe.md).

One virtual worker with Nm minibatches in flight (Little's law):
    X = min(Nm / T_roundtrip, 1 / max_k t_k)          minibatches per second
Under WSP each stage also pulls its weights from the parameter servers before every wave, and the
pull blocks it: a wave of stage k takes Nm t_k + pull_k, so X = Nm / max(T_roundtrip, max_k (Nm t_k +
pull_k)). If every VW's stage k pulled at the same instant, they would share each link for the whole
pull (`pull_s`, the worst case). That is what happens when some VWs are faster: WSP holds them at
its gate, which opens when the slowest VW's push lands, and they all pull at once, just as the
slowest VW pulls its next wave. When the VWs run at one pace, compute jitter spreads their wave
boundaries over the wave instead, and a pull arriving at a random instant finds its link busy with
probability rho, the link's utilisation at the common pace (PASTA: Poisson arrivals see time
averages; Wolff, Operations Research 30(2), 1982). It then takes the shared time, else its time
alone: pull = alone + rho (shared - alone). The pace depends on rho and rho on the pace, so the two
are iterated from the worst case. (On GPT-2 medium over 64 mixed GPUs this moved ED Nm8 from 182 to
189 samples/s, simulated 190.5, above NP/4 Nm2's 184: the pick the simulator confirms.) Every
virtual worker ends up at the pace of the slowest one, whatever D is, so the total is n_VW * min_i X_i.
Links cap that pace too: at a common pace r (minibatches per second per VW) a link carries r times
the bytes every VW sends across it per minibatch (activations forward, gradients back, and 1/Nm of
each wave's push and pull of the weights through the parameter servers), which must stay within its
bandwidth. BSP (Horovod) runs a ring all-reduce of the gradients after every wave, not
overlapped with compute.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from hetsim.cluster import host_of
from hetsim.planner.hetero import VwPartition, stage_seconds
from hetsim.topology import Topology

__all__ = ["Estimate", "PsRoutes", "vw_rate", "rate_bound", "wsp_estimate", "bsp_estimate", "link_loads", "pull_s",
           "bsp_pipeline_estimate", "plan_partitions"]


@dataclass(frozen=True, kw_only=True)
class Estimate:
    minibatches_per_s: float
    bottleneck: str          # what limits it: a GPU id, a link id or "all-reduce"


def vw_rate(part: VwPartition, nm: int) -> float:
    """Minibatches per second of one virtual worker on its own."""
    return min(nm / part.roundtrip_s, 1.0 / part.bottleneck_s)


class PsRoutes:
    """Per GPU, the links its parameter-server traffic crosses, each with the fraction of the GPU's
    weights that crosses it (weights spread evenly over the PS nodes; a link on k of the routes
    carries k / n_PS). Built once per GPU and shared by every candidate's estimate."""

    def __init__(self, topology: Topology):
        self.topology = topology
        self._pull: dict[str, dict[str, float]] = {}
        self._both: dict[str, dict[str, float]] = {}

    def pull(self, gpu: str) -> dict[str, float]:
        """Links from the PS nodes' hosts to `gpu`."""
        if gpu not in self._pull:
            self._pull[gpu] = self._fractions(gpu, ((host_of(n), gpu) for n in self.topology.cluster.ps_nodes))
        return self._pull[gpu]

    def both(self, gpu: str) -> dict[str, float]:
        """Links of the push to and the pull from every PS node."""
        if gpu not in self._both:
            ps = self.topology.cluster.ps_nodes
            self._both[gpu] = self._fractions(gpu, (pair for n in ps for pair in ((gpu, host_of(n)), (host_of(n), gpu))))
        return self._both[gpu]

    def _fractions(self, gpu: str, pairs) -> dict[str, float]:
        out: dict[str, float] = defaultdict(float)
        share = 1.0 / len(self.topology.cluster.ps_nodes)
        for src, dst in pairs:
            for link in self.topology.route(src, dst).links:
                out[link] += share
        return dict(out)


def rate_bound(parts: list[VwPartition], nm: int, *, summed: bool = False) -> float:
    """An upper bound of what any simulation of these VWs can sustain (minibatches per second, all VWs):
    each GPU computes every minibatch of its VW (1 / its compute), and each VW keeps at most Nm
    minibatches in flight, each taking at least its compute plus its transfers (Little's law).
    VWs held to the slowest one's pace (WSP, BSP) sustain at most n_VW x the smallest such bound;
    `summed` VWs that keep their own pace (SDPipe) the sum of them. Unlike the estimate it leaves out
    what overlaps in a simulation (pulls, sends during compute)."""
    each = [min(nm / p.roundtrip_s, 1.0 / max(p.compute_s)) for p in parts]
    return sum(each) if summed else len(parts) * min(each)


def link_loads(parts: list[VwPartition], nm: int, topology: Topology,
               routes: PsRoutes | None = None) -> dict[str, float]:
    """Bytes per link when every VW completes one minibatch (default PS placement: each stage's
    weights spread evenly over the PS nodes, pushed and pulled once per wave of Nm)."""
    routes = routes or PsRoutes(topology)
    load: dict[str, float] = defaultdict(float)
    for part in parts:
        for s, nbytes in enumerate(part.transfer_bytes):
            a, b = part.gpus[s], part.gpus[s + 1]
            for src, dst in ((a, b), (b, a)):
                for link in topology.route(src, dst).links:
                    load[link] += nbytes
        if len(parts) < 2:
            continue
        for gpu, weights in zip(part.gpus, part.param_bytes):
            for link, fraction in routes.both(gpu).items():
                load[link] += weights / nm * fraction
    return dict(load)


def pull_s(parts: list[VwPartition], topology: Topology, routes: PsRoutes | None = None,
           utilisation: dict[str, float] | None = None) -> list[list[float]]:
    """Seconds each stage spends pulling its weights. Without `utilisation`: sharing each link with
    the same stage of every VW for the whole pull (all pulled at once). With it (per link, the
    fraction of its capacity in use): on each link, its time alone, or with probability rho (the
    chance that a pull finds the link busy; PASTA) the time shared as above."""
    routes = routes or PsRoutes(topology)
    shares: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for part in parts:
        for s, (gpu, weights) in enumerate(zip(part.gpus, part.param_bytes)):
            for link, fraction in routes.pull(gpu).items():
                shares[s][link] += weights * fraction
    capacity = topology.capacity_Bps
    rho = utilisation.get if utilisation is not None else lambda link: 1.0

    def seconds(s: int, gpu: str, weights: int) -> float:
        return max(((1 - rho(link)) * weights * fraction + rho(link) * shares[s][link]) / capacity[link]
                   for link, fraction in routes.pull(gpu).items()) if routes.pull(gpu) else 0.0
    return [[seconds(s, gpu, w) for s, (gpu, w) in enumerate(zip(part.gpus, part.param_bytes))] for part in parts]


# Rounds of the pace <-> link utilisation iteration: the pace moves by well under 1 % after the third.
_PACE_ROUNDS = 4
# VWs faster than the slowest by more than this wait at the WSP gate (compute jitter and the finite
# window absorb less), and pull together when it opens.
_GATED = 0.05


def wsp_estimate(parts: list[VwPartition], nm: int, topology: Topology, routes: PsRoutes | None = None) -> Estimate:
    """n_VW x the common pace: pulls spread over the wave when every VW runs at about one pace
    (within `_GATED`), pulled all at once otherwise (see the module docstring); links cap the pace."""
    routes = routes or PsRoutes(topology)
    loads = sorted(link_loads(parts, nm, topology, routes).items())
    capacity = topology.capacity_Bps
    link_pace, link = min(((capacity[l] / b, l) for l, b in loads if b > 0), default=(float("inf"), ""))
    rate = lambda pulls: [nm / max(p.roundtrip_s, max(nm * t + q for t, q in zip(p.stage_s, pulls[i])))
                          for i, p in enumerate(parts)]
    rates = rate(pull_s(parts, topology, routes))
    if max(rates) <= min(rates) * (1 + _GATED):
        for _ in range(_PACE_ROUNDS):
            pace = min(min(rates), link_pace)
            rates = rate(pull_s(parts, topology, routes, {l: min(pace * b / capacity[l], 1.0) for l, b in loads}))
    slowest = min(range(len(parts)), key=lambda i: rates[i])
    if link_pace < rates[slowest]:
        return Estimate(minibatches_per_s=len(parts) * link_pace, bottleneck=link)
    return Estimate(minibatches_per_s=len(parts) * rates[slowest], bottleneck=parts[slowest].bottleneck_gpu)


def bsp_estimate(parts: list[VwPartition], nm: int, param_bytes: int, bandwidth_Bps: float) -> Estimate:
    """Flush schedule: a wave is Nm minibatches through the slowest VW, then a ring all-reduce."""
    n = len(parts)
    wave = lambda p: p.roundtrip_s + (nm - 1) * p.bottleneck_s
    slowest = max(parts, key=wave)
    allreduce_s = 2 * (n - 1) / n * param_bytes / bandwidth_Bps if n > 1 else 0.0
    bottleneck = "all-reduce" if allreduce_s > wave(slowest) else slowest.bottleneck_gpu
    return Estimate(minibatches_per_s=n * nm / (wave(slowest) + allreduce_s), bottleneck=bottleneck)


def bsp_pipeline_estimate(parts: list[VwPartition], nm: int, topology: Topology) -> Estimate:
    """Sync bsp over pipelined VWs with one set of layer ranges: a flush wave (the slowest VW's
    roundtrip plus Nm - 1 bottleneck stages), then stage by stage a ring all-reduce of its gradients
    over the VWs (2 (n - 1) / n of its weights at the ring's slowest hop). Stage k's starts when its
    last backward ends, before stage 0's by the backward drain from k to 0, and it need not end
    before the next wave's first forward reaches stage k: it hides behind the compute and transfers
    of stages 0..k-1, and the wave is lengthened by max_k (all-reduce_k - that slack)."""
    n = len(parts)
    slowest = max(parts, key=lambda p: p.roundtrip_s + (nm - 1) * p.bottleneck_s)
    wave = slowest.roundtrip_s + (nm - 1) * slowest.bottleneck_s
    tail, slack = 0.0, 0.0
    for k in range(len(slowest.gpus)):
        ring = [p.gpus[k] for p in parts]
        bw = min((topology.bottleneck_Bps(a, b) for a, b in zip(ring, ring[1:] + ring[:1]) if a != b),
                 default=float("inf"))
        tail = max(tail, 2 * (n - 1) / n * slowest.param_bytes[k] / bw - slack)
        slack += slowest.compute_s[k] + (2 * slowest.transfer_s[k] if k + 1 < len(slowest.gpus) else 0.0)
    bottleneck = "all-reduce" if tail > wave / 10 else slowest.bottleneck_gpu
    return Estimate(minibatches_per_s=n * nm / (wave + tail), bottleneck=bottleneck)


def plan_partitions(plan, cluster, profile) -> list[VwPartition]:
    """Each virtual worker of a written plan as the estimator sees it, tensor-parallel stages
    included: a TP stage's compute is its TP time plus its activation all-reduces (a ring over the
    node's links, when the times leave them out). Transfers in and out count in full against each
    stage, as when point-to-point calls block (a stage with blocking_p2p waits out its sends); under a
    schedule of rendezvous transfers (DeepSpeed's: each holds sender and receiver until delivered)
    both directions count, an activation and a gradient across each of the stage's boundaries (with
    blocking_p2p: see hetero.stage_seconds)."""
    from hetsim.feasibility import plan_memory
    profile = profile.scaled_to_batch(plan.minibatch_size)
    topology = Topology(cluster)
    memory = plan_memory(plan, cluster, profile)
    parts = []
    for vw in plan.virtual_workers:
        compute, transfer, nbytes = [], [], []
        for s, stage in enumerate(vw.stages):
            lo, hi = stage.layers
            times = profile.stage_times_tp(cluster.gpu(stage.gpu).type.name, lo, hi, stage.tp, plan.recompute)
            ring = 0.0
            if stage.tp > 1 and not times.measured_tp:
                ring = topology.tp_passes_s(topology.node_of(stage.gpu), stage.tp, profile, lo, hi,
                                            plan.activation_scale, plan.recompute)
            compute.append(times.fwd_s + times.bwd_s + ring)
            if s + 1 < len(vw.stages):
                nxt = vw.stages[s + 1].gpu
                nbytes.append(int(profile.cut_bytes(hi) * plan.activation_scale))
                transfer.append(topology.route(stage.gpu, nxt).latency_s
                                + nbytes[-1] / topology.bottleneck_Bps(stage.gpu, nxt))
        stage_s = stage_seconds(compute, transfer, plan.schedule, plan.blocking_p2p)
        parts.append(VwPartition(gpus=tuple(s.gpu for s in vw.stages),
                                 boundaries=(0, *(s.layers[1] for s in vw.stages)), compute_s=tuple(compute),
                                 transfer_s=tuple(transfer), transfer_bytes=tuple(nbytes),
                                 param_bytes=tuple(profile.stage_param_bytes(*s.layers) for s in vw.stages),
                                 stage_s=stage_s, memory_bytes=tuple(memory[s.gpu].total_bytes for s in vw.stages)))
    return parts
