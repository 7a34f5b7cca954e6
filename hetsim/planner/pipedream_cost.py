"""PipeDream's own cost model, so its choices can be set beside hetsim's.

Narayanan et al., "PipeDream: generalized pipeline parallelism for DNN training", SOSP'19, section
3.1 (../shared/reference/pipedream.md), and its optimizer (optimizer_graph_hierarchical.py):

    sync(w, m)      = 4 (m - 1) |w| / (m B)         weight all-reduce among m replicas of a stage
    T(i -> j, m)    = max(compute(i -> j), sync(w(i -> j), m)) / m
    cut(a)          = 2 a / B                       activations forward, their gradients back
    A(j, m)         = min over i < j, m' <= m of max(A(i, m - m'), cut(a_i), T(i+1 -> j, m'))

A ring all-reduce sends 2(m-1)/m |w| bytes per worker and receives as many; PipeDream charges both
against the one bandwidth B, hence the 4. Hierarchical: every range is solved inside one server at its
bandwidth, then each server is one worker of the next level. Nothing here models Nm, staleness,
parameter servers, contention or unequal GPUs: that is the point of the comparison.

The DP itself is `hetsim.planner.chain` (pipedream_partition, hierarchical_partition); this module holds
the formulas, the cluster's levels, the flattened configuration PipeDream prints ("15-1") and
PipeDream's estimate of any hetsim candidate, which `hetsim plan --cost-model pipedream` ranks by.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from hetsim.cluster import Cluster
from hetsim.errors import PlanError
from hetsim.planner.antichain import AntichainStates, antichain_costs, antichain_states
from hetsim.planner.chain import ChainPartition, StateCosts, hierarchical_partition, pipedream_partition
from hetsim.planner.estimate import Estimate
from hetsim.planner.hetero import VwPartition
from hetsim.planner.search import SearchResult
from hetsim.profile import ModelProfile
from hetsim.topology import Topology

__all__ = ["SYNC_BYTES_FACTOR", "sync_s", "stage_s", "cut_s", "cluster_levels", "ConfigStage",
           "PipeDreamConfig", "pipedream_config", "without_input_time", "candidate_estimate", "rerank",
           "optimum_line"]

SYNC_BYTES_FACTOR = 4.0


def sync_s(param_bytes, replicas: int, bandwidth_Bps: float):
    """PipeDream's weight all-reduce time among `replicas` copies of a stage (0 for one copy)."""
    return SYNC_BYTES_FACTOR * (replicas - 1) * np.asarray(param_bytes, dtype=float) / (replicas * bandwidth_Bps)


def stage_s(compute_s, param_bytes, replicas: int, bandwidth_Bps: float):
    """T(i -> j, m): seconds per minibatch of a stage with m replicas (compute and sync overlap)."""
    return np.maximum(compute_s, sync_s(param_bytes, replicas, bandwidth_Bps)) / replicas


def cut_s(cut_bytes, bandwidth_Bps: float):
    """Seconds per minibatch on a cut: the activations and, on the way back, their gradients."""
    return 2.0 * np.asarray(cut_bytes, dtype=float) / bandwidth_Bps


def cluster_levels(cluster: Cluster) -> list[tuple[int, float]]:
    """[(GPUs per server, intra-server bandwidth), (servers, network bandwidth)], innermost first,
    as PipeDream's hierarchical optimizer takes them; one level for one server."""
    types = sorted(cluster.gpu_types)
    if len(types) != 1:
        raise PlanError(f"cluster {cluster.name}: PipeDream's optimizer assumes one GPU type, "
                        f"this cluster has {', '.join(types)}")
    sizes = sorted({len(n.gpus) for n in cluster.nodes})
    if len(sizes) != 1:
        raise PlanError(f"cluster {cluster.name}: PipeDream's optimizer assumes servers of equal size, "
                        f"these hold {', '.join(map(str, sizes))} GPUs")
    levels = [(sizes[0], min(n.intra_link.bandwidth_Bps for n in cluster.nodes))]
    if len(cluster.nodes) > 1:
        levels.append((len(cluster.nodes), min(cluster.nic(n.name).bandwidth_Bps for n in cluster.nodes)))
    return levels


@dataclass(frozen=True, kw_only=True)
class ConfigStage:
    layers: tuple[int, ...]          # profile layer indices
    replicas: int                    # GPUs in all


@dataclass(frozen=True, kw_only=True)
class PipeDreamConfig:
    stages: tuple[ConfigStage, ...]
    bottleneck_s: float              # PipeDream's predicted seconds per minibatch
    levels: tuple[tuple[int, float], ...]
    n_states: int

    @property
    def gpus(self) -> int:
        return sum(s.replicas for s in self.stages)

    @property
    def label(self) -> str:
        """PipeDream's notation: replicas per stage ("15-1"), "16" for data parallelism, "straight"."""
        if len(self.stages) > 1 and all(s.replicas == 1 for s in self.stages):
            return "straight"
        return "-".join(str(s.replicas) for s in self.stages)

    @property
    def minibatches_per_s(self) -> float:
        return 1.0 / self.bottleneck_s


def without_input_time(profile: ModelProfile) -> ModelProfile:
    """PipeDream's optimizer zeroes the Input node (its forward time is data loading, which every
    stage-0 replica does anyway)."""
    zero = lambda times: {k: 0.0 for k in times}
    layers = tuple(replace(l, fwd_s=zero(l.fwd_s), bwd_s=zero(l.bwd_s)) if l.kind.startswith("Input") else l
                   for l in profile.layers)
    return replace(profile, layers=layers)


def pipedream_config(profile: ModelProfile, cluster: Cluster, *, flat: bool = False) -> PipeDreamConfig:
    """PipeDream's optimum for `profile` on `cluster` (one GPU type, servers of equal size).

    `flat` solves one level over every GPU at the slowest bandwidth instead of the hierarchy."""
    levels = cluster_levels(cluster)
    gpu_type = next(iter(cluster.gpu_types))
    states = antichain_states(profile)
    costs = antichain_costs(without_input_time(profile), states, gpu_type)
    if flat or len(levels) == 1:
        level = (len(cluster.gpus), min(b for _, b in levels))
        part = pipedream_partition(costs, level[0], bandwidth_Bps=level[1])
        stages = tuple(ConfigStage(layers=_layers(states, s.states), replicas=s.replicas) for s in part.stages)
        return PipeDreamConfig(stages=stages, bottleneck_s=part.bottleneck_s, levels=(level,),
                               n_states=costs.n_states)
    outer = hierarchical_partition(costs, levels)
    return PipeDreamConfig(stages=_flatten(outer, costs, states, levels[0]), bottleneck_s=outer.bottleneck_s,
                           levels=tuple(levels), n_states=costs.n_states)


def _flatten(outer: ChainPartition, costs: StateCosts, states: AntichainStates,
             inner: tuple[int, float]) -> tuple[ConfigStage, ...]:
    """Outer stages replicated over r servers, each running its range's inner optimum: the inner
    stages' replicas times r, as PipeDream prints them."""
    out = []
    for stage in outer.stages:
        i, j = stage.states
        sub, index = _sub_costs(costs, i, j)
        part = pipedream_partition(sub, inner[0], bandwidth_Bps=inner[1])
        for s in part.stages:
            a, b = s.states
            out.append(ConfigStage(layers=_layers(states, (index[a], index[b])), replicas=s.replicas * stage.replicas))
    return tuple(out)


def _sub_costs(costs: StateCosts, i: int, j: int) -> tuple[StateCosts, list[int]]:
    """The states between i and j (nested in both directions), costs counted from i."""
    index = [k for k in range(costs.n_states) if k in (i, j) or (costs.nested[i, k] and costs.nested[k, j])]
    sub = StateCosts(compute_s=costs.compute_s[index] - costs.compute_s[i],
                     param_bytes=costs.param_bytes[index] - costs.param_bytes[i],
                     cut_bytes=costs.cut_bytes[index], nested=costs.nested[np.ix_(index, index)])
    return sub, index


def _layers(states: AntichainStates, pair: tuple[int, int]) -> tuple[int, ...]:
    rows = states.members
    return tuple(np.flatnonzero(rows[pair[1]] & ~rows[pair[0]]).tolist())


def candidate_estimate(parts: list[VwPartition], topology: Topology) -> Estimate:
    """PipeDream's formulas applied to a hetsim candidate: stage k of every VW is one data-parallel
    stage with as many replicas as VWs have it (the slowest replica's compute, the largest replica's
    weights, the ring's slowest hop); each cut costs 2a/B on its own link, divided by the replicas
    as PipeDream's optimizer divides a stage's input transfer. Nm, D and parameter servers are ignored."""
    worst, label = 0.0, ""
    for k in range(max(len(p.gpus) for p in parts)):
        members = [p for p in parts if k < len(p.gpus)]
        m = len(members)
        ring = [p.gpus[k] for p in members]
        bandwidth = min((topology.bottleneck_Bps(a, b) for a, b in zip(ring, ring[1:] + ring[:1]) if a != b),
                        default=float("inf"))
        compute = max(p.compute_s[k] for p in members)
        weights = max(p.param_bytes[k] for p in members)
        sync = float(sync_s(weights, m, bandwidth)) if m > 1 else 0.0
        t = max(compute, sync) / m
        if t > worst:
            worst, label = t, f"stage {k}" if compute >= sync else f"sync stage {k}"
        if k + 1 < min(len(p.gpus) for p in members):
            cut = max(float(cut_s(p.transfer_bytes[k], topology.bottleneck_Bps(p.gpus[k], p.gpus[k + 1])))
                      for p in members) / m
            if cut > worst:
                worst, label = cut, f"cut {k}"
    return Estimate(minibatches_per_s=1.0 / worst if worst > 0 else float("inf"), bottleneck=label)


def rerank(result: SearchResult, cluster: Cluster) -> SearchResult:
    """A search result ranked by PipeDream's estimate alone (no simulation), ties by D then Nm."""
    topology = Topology(cluster)
    feasible = [replace(c, simulated_mb_s=None, estimate=candidate_estimate(list(c.partitions), topology))
                for c in result.candidates if c.feasible]
    feasible.sort(key=lambda c: (-c.estimate.minibatches_per_s, c.staleness, c.nm))
    rest = [c for c in result.candidates if not c.feasible]
    return SearchResult(candidates=tuple(feasible + rest), simulated=0)


def optimum_line(profile: ModelProfile, cluster: Cluster, activation_scale: float = 1.0) -> str:
    """One line for `hetsim plan`: PipeDream's own optimum on this cluster, or why it has none, with
    activations on the wire at `activation_scale` of the profile's bytes (a 16-bit plan's half)."""
    if activation_scale != 1.0:
        wire = lambda b: int(b * activation_scale)
        profile = replace(profile, input_bytes=wire(profile.input_bytes),
                          layers=tuple(replace(l, output_bytes=wire(l.output_bytes)) for l in profile.layers))
    try:
        config = pipedream_config(profile, cluster)
    except PlanError as exc:
        return f"PipeDream's optimizer: no configuration ({exc})"
    return (f"PipeDream's optimizer on {cluster.name}: {config.label} over {config.gpus} GPUs, "
            f"{config.minibatches_per_s * profile.batch_size:.1f} samples/s by its formulas "
            f"(stages of {', '.join(str(len(s.layers)) for s in config.stages)} layers; "
            "no Nm, staleness or contention)")
