"""Sync bsp and sdpipe average stage by stage, so the search gives every VW the same layer ranges.

Each VW partitioned on its own gets ranges that suit its GPUs; on a cluster whose nodes differ, NP's
VWs then differ and `check_plan` refuses every multi-VW plan. One split for all VWs
(`partition_aligned`: each stage costs its slowest VW's time) makes them runnable.
"""

import pytest

import hetsim
from conftest import cluster, gpu_type
from hetsim.feasibility import check_plan
from hetsim.memory import MemorySettings
from hetsim.planner.estimate import rate_bound
from hetsim.planner.hetero import _describe, partition_aligned, partition_ordered
from hetsim.planner.search import SearchSpace, _simulate, search_plans
from hetsim.profile import LayerProfile, ModelProfile
from hetsim.topology import Topology
from test_search_exact import FAST, SLOW, toy_model

MIXED = cluster([2, 2], types=[FAST, SLOW], intra_Bps=10e9, net_Bps=1.25e9, latency_s=1e-5)


def skewed_model(n: int = 8) -> ModelProfile:
    """The slow type is 3x slower on the first half of the layers and as fast on the second, so each
    node's own best split differs."""
    f = lambda i: {"fast": 0.01, "slow": 0.03 if i < n // 2 else 0.01, "mid": 0.02}
    layers = tuple(LayerProfile(name=f"l{i}", kind="x", param_bytes=2**20, output_bytes=2**20, fwd_s=f(i),
                                bwd_s={t: 2 * v for t, v in f(i).items()}) for i in range(n))
    return ModelProfile(model="skewed", batch_size=8, layers=layers, edges=tuple((i, i + 1) for i in range(n - 1)),
                        input_bytes=2**20)


def test_one_split_for_every_lane_is_the_best_for_the_slowest_stage_over_lanes():
    topology, p = Topology(MIXED), toy_model()
    lanes = [list(MIXED.nodes[0].gpus), list(MIXED.nodes[1].gpus)]
    parts = partition_aligned(p, lanes, topology, nm=2)
    assert parts[0].boundaries == parts[1].boundaries
    assert [x.gpus for x in parts] == [tuple(g.id for g in lane) for lane in lanes]
    # Brute force over every cut of two stages: none has a lower slowest stage over both lanes.
    brute = min(max(max(_stage_s(p, lane, topology, cut)) for lane in lanes) for cut in range(1, p.n_layers))
    assert max(x.bottleneck_s for x in parts) == pytest.approx(brute)
    # The slow lane's own best split is no slower: one split for both costs something.
    assert max(x.bottleneck_s for x in parts) >= partition_ordered(p, lanes[1], topology, nm=2).bottleneck_s


def _stage_s(p, lane, topology, cut):
    return _describe(p, lane, (0, cut, p.n_layers), topology, 2, "hetpipe", MemorySettings(), {}).stage_s


def test_lanes_of_unequal_length_are_refused_naming_the_sync_modes():
    with pytest.raises(Exception, match="sync bsp and sdpipe"):
        partition_aligned(toy_model(), [list(MIXED.nodes[0].gpus), [MIXED.nodes[1].gpus[0]]],
                          Topology(MIXED), nm=2)


@pytest.mark.parametrize("sync, schedule", [("bsp", "1f1b-flush"), ("sdpipe", "hetpipe")])
def test_np_on_unlike_nodes_gets_one_split_for_both_vws_and_runs(sync, schedule):
    space = SearchSpace(policies=("NP",), nm_values=(2,), sync=sync, schedule=schedule, waves=8, workers=1)
    model = skewed_model()
    own = [partition_ordered(model, list(n.gpus), Topology(MIXED), nm=2).boundaries for n in MIXED.nodes]
    assert own[0] != own[1]                      # partitioned on their own, the VWs would differ
    result = search_plans(MIXED, model, space)
    multi = [c for c in result.candidates if c.feasible and len(c.partitions) == 2]
    assert multi, [c.reason for c in result.candidates]
    plan = multi[0].plan
    assert plan.sync.mode == sync
    assert len({tuple(s.layers for s in vw.stages) for vw in plan.virtual_workers}) == 1
    check_plan(plan, MIXED, model)
    assert _simulate((MIXED, model, plan, space)).mb_s > 0


def test_sdpipe_candidates_score_what_simulate_reports_and_the_bounded_search_finds_the_exhaustive_best():
    # Fast and 4x slower nodes: under SDPipe a fast VW keeps its lead, so the report sums the VWs'
    # rates; n_VW x the slowest (WSP's long-run rate) halved DP here and put ED first.
    fast, slow = gpu_type("fast"), gpu_type("slow")
    c = cluster([4, 4], intra_Bps=2e9, net_Bps=1.25e8, types=[fast, slow])
    layers = tuple(LayerProfile(name=f"l{i}", kind="Linear", param_bytes=10_000, output_bytes=4_000_000,
                                fwd_s={"fast": 0.01, "slow": 0.04}, bwd_s={"fast": 0.02, "slow": 0.08})
                   for i in range(8))
    p = ModelProfile(model="two-speed", batch_size=1, layers=layers, edges=tuple((i, i + 1) for i in range(7)),
                     input_bytes=0)
    kw = dict(policies=("NP", "ED", "HD", "auto"), nm_values=(4,), workers=1, waves=20, sync="sdpipe")
    bounded, every = search_plans(c, p, SearchSpace(**kw)), search_plans(c, p, SearchSpace(exhaustive=True, **kw))
    assert bounded.best.plan.name == every.best.plan.name
    for cand in [x for x in every.candidates if x.simulated_mb_s][:3]:
        report = hetsim.simulate(c, p, cand.plan, waves=20, warmup_waves=2, jitter_cv=0.02, seed=0, trace=False)
        assert cand.simulated_mb_s == report.throughput["minibatches_per_s"]
        rates = [v.minibatches_per_s for v in report.virtual_workers]
        assert rate_bound(list(cand.partitions), cand.nm, summed=True) >= sum(rates)
    # Unequal VWs whose sum is what counts: DP's fast VWs are more than twice the slow ones here.
    dp = next(x for x in every.candidates if x.policy == "DP" and x.simulated_mb_s)
    assert dp.simulated_mb_s > 1.5 * len(dp.partitions) * min(
        v.minibatches_per_s for v in hetsim.simulate(c, p, dp.plan, waves=20, jitter_cv=0.02, trace=False).virtual_workers)
