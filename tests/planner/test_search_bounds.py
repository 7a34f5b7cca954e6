"""The pieces that make the search fast give what the slow way gives: lazy best-first order,
partitions shared between VWs of one shape, node-kind order merging, per-GPU PS routes."""

import itertools
import random

import pytest

from conftest import cluster, gpu_type
from hetsim.cluster import host_of
from hetsim.planner.bounds import LazyEstimate, best_first
from hetsim.planner.estimate import Estimate, pull_s, link_loads
from hetsim.planner.hetero import partition_ordered, partition_vw
from hetsim.planner.memo import PartitionMemo, vw_shape
from hetsim.topology import Topology
from test_search_exact import toy_model

FAST, SLOW = gpu_type("fast", 2.0), gpu_type("slow", 0.75)


def fixed(chain: list[float]) -> LazyEstimate:
    """A lazy estimate whose bounds are `chain` (non-increasing), the last one the estimate."""
    lazy = LazyEstimate(chain[0], lambda: [], 1, None, Estimate(minibatches_per_s=chain[-1], bottleneck="x"))
    levels = iter(chain[1:])
    lazy.refine = lambda: lazy.bounds.append(next(levels)) or lazy.bounds[-1]
    return lazy


def test_best_first_gives_the_order_of_sorting_every_estimate():
    rng = random.Random(7)
    items = []
    for i in range(60):
        final = rng.choice([1.0, 2.0, 3.0, rng.random() * 4])      # ties on purpose
        chain = sorted([final, final + rng.random() * 3, final + rng.random() * 5], reverse=True)
        items.append((fixed(chain), rng.choice([0, 2]), rng.choice([1, 2, 4])))
    order = [i for i, _ in best_first(items)]
    expected = sorted(range(len(items)), key=lambda i: (-items[i][0]._estimate.minibatches_per_s,
                                                        items[i][1], items[i][2], i))
    assert order == expected


def test_best_first_refines_only_what_reaches_the_top():
    items = [(fixed([10.0, 9.0, 8.0]), 0, 1), (fixed([5.0, 4.0, 3.0]), 0, 1)]
    first = next(best_first(items))
    assert first[0] == 0 and len(items[1][0].bounds) == 1         # the second was never refined


def test_an_allocation_that_cannot_run_comes_out_once():
    from hetsim.errors import PlanError

    def fails():
        raise PlanError("does not fit")
    lazy = LazyEstimate(9.0, fails, 1, None)
    out = list(best_first([(lazy, 0, 1), (lazy, 2, 1), (fixed([1.0, 1.0, 1.0]), 0, 1)]))
    assert out[0] == (0, None) and [i for i, l in out if l is not None] == [2]


def test_vws_of_one_shape_on_other_nodes_share_the_partition_relabelled():
    c = cluster([2, 2, 2, 2], types=[FAST, SLOW, FAST, SLOW], intra_Bps=10e9, net_Bps=1.25e9, latency_s=1e-5)
    topology, p = Topology(c), toy_model()
    memo = PartitionMemo(c, p, topology)
    a = ("node0/gpu0", "node0/gpu1", "node1/gpu0", "node1/gpu1")
    b = ("node2/gpu0", "node2/gpu1", "node3/gpu0", "node3/gpu1")
    assert vw_shape(c, [memo.slot(g) for g in a])[0] == vw_shape(c, [memo.slot(g) for g in b])[0]
    shared = memo.partition(a, 2, "hetpipe"), memo.partition(b, 2, "hetpipe")
    fresh = partition_vw(p, [memo.slot(g) for g in b], topology, nm=2)
    assert sorted(shared[1].gpus) == sorted(b)
    assert (shared[1].boundaries, shared[1].stage_s) == (fresh.boundaries, fresh.stage_s)
    assert [c.gpu(g).type.name for g in shared[1].gpus] == [c.gpu(g).type.name for g in fresh.gpus]


def test_merging_orders_of_alike_nodes_loses_nothing_against_every_permutation():
    # Three nodes, two alike: every distinct order is tried by brute force, the best split kept.
    c = cluster([1, 1, 1], types=[SLOW, SLOW, FAST], intra_Bps=10e9, net_Bps=1.25e9, latency_s=1e-5)
    topology, p = Topology(c), toy_model()
    gpus = list(c.gpus)
    brute = min((partition_ordered(p, list(order), topology, nm=2) for order in itertools.permutations(gpus)),
                key=lambda part: part.bottleneck_s)
    assert partition_vw(p, gpus, topology, nm=2).bottleneck_s == brute.bottleneck_s


def test_per_gpu_ps_routes_give_the_sum_over_every_route():
    c = cluster([2, 2, 1], types=[FAST, SLOW, FAST], intra_Bps=10e9, net_Bps=1.25e9, latency_s=1e-5)
    topology, p = Topology(c), toy_model()
    parts = [partition_vw(p, list(n.gpus), topology, nm=2) for n in c.nodes]
    loads = link_loads(parts, 2, topology)
    naive: dict[str, float] = {}
    for part in parts:
        for s, nbytes in enumerate(part.transfer_bytes):
            for src, dst in ((part.gpus[s], part.gpus[s + 1]), (part.gpus[s + 1], part.gpus[s])):
                for link in topology.route(src, dst).links:
                    naive[link] = naive.get(link, 0.0) + nbytes
        for gpu, weights in zip(part.gpus, part.param_bytes):
            for node in c.ps_nodes:
                for src, dst in ((gpu, host_of(node)), (host_of(node), gpu)):
                    for link in topology.route(src, dst).links:
                        naive[link] = naive.get(link, 0.0) + weights / len(c.ps_nodes) / 2
    assert loads == pytest.approx(naive)
    shares: dict[tuple[int, str], float] = {}
    for part in parts:
        for s, (gpu, weights) in enumerate(zip(part.gpus, part.param_bytes)):
            for node in c.ps_nodes:
                for link in topology.route(host_of(node), gpu).links:
                    shares[s, link] = shares.get((s, link), 0.0) + weights / len(c.ps_nodes)
    naive_pull = [[max(shares[s, link] / topology.capacity_Bps[link] for node in c.ps_nodes
                       for link in topology.route(host_of(node), gpu).links) for s, gpu in enumerate(part.gpus)]
                  for part in parts]
    assert pull_s(parts, topology) == [pytest.approx(row) for row in naive_pull]
