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
        for node in cluster.nodes:
            self._node_of[f"{node.name}/host"] = node.name
            self._intra_latency[node.name] = node.intra_link.latency_s
            for gpu in node.gpus:
                self._node_of[gpu.id] = node.name
                self.capacity_Bps[f"{gpu.id}:out"] = node.intra_link.bandwidth_Bps
                self.capacity_Bps[f"{gpu.id}:in"] = node.intra_link.bandwidth_Bps
            if len(cluster.nodes) > 1:
                self.capacity_Bps[f"{node.name}:nic:out"] = cluster.network.bandwidth_Bps
                self.capacity_Bps[f"{node.name}:nic:in"] = cluster.network.bandwidth_Bps
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
            links += [f"{src_node}:nic:out", f"{dst_node}:nic:in"]
            latency += self.cluster.network.latency_s
        if not dst.endswith("/host"):
            links.append(f"{dst}:in")
            latency += self._intra_latency[dst_node] if src_node != dst_node or src.endswith("/host") else 0.0
        return Route(tuple(links), latency)

    def bottleneck_Bps(self, src: str, dst: str) -> float:
        """The slowest link's bandwidth on the route, for analytic estimates (inf if local)."""
        links = self.route(src, dst).links
        return min((self.capacity_Bps[l] for l in links), default=float("inf"))
