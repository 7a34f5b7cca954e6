"""Which links a transfer crosses: pure routing over a cluster, shared by simulator and planner.

Each GPU has one port into its node's fabric (PCIe or NVLink) and each node one network interface;
every link is full duplex, so each direction is a separate capacity ("node0/gpu1:out").
"""

from __future__ import annotations

from dataclasses import dataclass

from hetsim.cluster import Cluster

__all__ = ["Route", "Topology"]


@dataclass(frozen=True)
class Route:
    links: tuple[str, ...]
    latency_s: float


class Topology:
    """Link capacities (bytes/s per direction) and routes between endpoints.

    Endpoints are GPU ids ("node0/gpu1") or host ids ("node0/host").
    """

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.capacity_Bps: dict[str, float] = {}
        self._node_of: dict[str, str] = {}
        self._intra_latency: dict[str, float] = {}
        self._nic_of: dict[str, str] = {}
        for node in cluster.nodes:
            self._node_of[f"{node.name}/host"] = node.name
            self._nic_of[f"{node.name}/host"] = node.name
            self._intra_latency[node.name] = node.intra_link.latency_s
            for gpu in node.gpus:
                self._node_of[gpu.id] = node.name
                self.capacity_Bps[f"{gpu.id}:out"] = node.intra_link.bandwidth_Bps
                self.capacity_Bps[f"{gpu.id}:in"] = node.intra_link.bandwidth_Bps
                self._nic_of[gpu.id] = gpu.id if node.nic_per_gpu else node.name
            if len(cluster.nodes) > 1:
                nic = node.nic or cluster.network
                for owner in dict.fromkeys([node.name, *(self._nic_of[g.id] for g in node.gpus)]):
                    self.capacity_Bps[f"{owner}:nic:out"] = nic.bandwidth_Bps
                    self.capacity_Bps[f"{owner}:nic:in"] = nic.bandwidth_Bps
        self._paths: dict[tuple[str, str], tuple[str, float]] = {}
        for path in cluster.paths:
            a, b = path.nodes
            for src, dst in ((a, b), (b, a)):
                name = f"{src}~{dst}"
                self.capacity_Bps[name] = path.link.bandwidth_Bps
                self._paths[(src, dst)] = (name, path.link.latency_s)
        self._routes: dict[tuple[str, str], Route] = {}

    def node_of(self, endpoint: str) -> str:
        return self._node_of[endpoint]

    def route(self, src: str, dst: str) -> Route:
        key = (src, dst)
        if key not in self._routes:
            self._routes[key] = self._compute_route(src, dst)
        return self._routes[key]

    def _compute_route(self, src: str, dst: str) -> Route:
        if src == dst:
            return Route((), 0.0)
        src_node, dst_node = self._node_of[src], self._node_of[dst]
        links: list[str] = []
        latency = 0.0
        if not src.endswith("/host"):
            links.append(f"{src}:out")
            latency += self._intra_latency[src_node]
        if src_node != dst_node:
            links += [f"{self._nic_of[src]}:nic:out", f"{self._nic_of[dst]}:nic:in"]
            latency += max(self.cluster.nic(src_node).latency_s, self.cluster.nic(dst_node).latency_s)
            if (src_node, dst_node) in self._paths:
                name, path_latency = self._paths[(src_node, dst_node)]
                links.append(name)
                latency += path_latency
        if not dst.endswith("/host"):
            links.append(f"{dst}:in")
            latency += self._intra_latency[dst_node] if src_node != dst_node or src.endswith("/host") else 0.0
        return Route(tuple(links), latency)

    def collective_overhead_s(self, gpus: list[str], calls: int) -> float:
        """What `calls` ring all-reduces among `gpus` take beyond one ring of all their bytes, with
        nothing else on the links: each call's fixed cost (the `collective_latency_s` of the links it
        spans, the slowest of them) and the per-message latency of every further call's 2(n - 1) steps.
        Fewer than one call counts as one: bytes all-reduced take a call."""
        if len(gpus) < 2:
            return 0.0
        calls = max(calls, 1)
        nodes = {self._node_of[g] for g in gpus}
        links = [self.cluster.node(n).intra_link for n in nodes]
        if len(nodes) > 1:
            links += [self.cluster.nic(n) for n in nodes]
        step = max(self.route(a, b).latency_s for a, b in zip(gpus, gpus[1:] + gpus[:1]))
        return calls * max(l.collective_latency_s for l in links) + (calls - 1) * 2 * (len(gpus) - 1) * step

    def tp_pass_s(self, node: str, tp: int, nbytes: float, calls: int) -> float:
        """One pass's activation all-reduces of a tensor-parallel group of `tp` GPUs of `node` on idle
        links: `calls` rings moving nbytes in all, each step paying the node link's latency, each call
        its collective latency (as the simulator's ring_allreduce with collective_overhead_s)."""
        if tp < 2 or nbytes <= 0:
            return 0.0
        link, steps, calls = self.cluster.node(node).intra_link, 2 * (tp - 1), max(calls, 1)
        # The bytes' term in the order the estimates always computed it, so that zero latencies change nothing.
        return steps / tp * nbytes / link.bandwidth_Bps + calls * (steps * link.latency_s + link.collective_latency_s)

    def tp_passes_s(self, node: str, tp: int, profile, lo: int, hi: int, scale: float = 1.0,
                    recompute: bool = False) -> float:
        """A forward's and a backward's all-reduces of layers [lo, hi) of `profile` (tp_pass_s each),
        their bytes times `scale` (Plan.activation_scale); with `recompute` the backward's include the
        recomputed forward's."""
        return sum(self.tp_pass_s(node, tp, profile.stage_tp_allreduce_bytes(lo, hi, backward, recompute) * scale,
                                  profile.stage_tp_allreduce_calls(lo, hi, backward, recompute))
                   for backward in (False, True))

    def bottleneck_Bps(self, src: str, dst: str) -> float:
        """The slowest link's bandwidth on the route, for analytic estimates (inf if local)."""
        links = self.route(src, dst).links
        return min((self.capacity_Bps[l] for l in links), default=float("inf"))
