"""The WSP estimate's pulls: shared by every VW at once (the worst case), or spread over the wave.

When every VW runs at one pace, a pull finds its link busy with probability rho (the link's
utilisation) and only then shares it: pull = alone + rho (shared - alone). Closed forms first, then
the simulator on a cluster of alike nodes whose VWs all span both nodes.
"""

import pytest

from conftest import cluster
from hetsim.planner.estimate import PsRoutes, bsp_pipeline_estimate, link_loads, pull_s, wsp_estimate
from hetsim.planner.search import SearchSpace, _simulate, search_plans
from hetsim.topology import Topology
from test_search_exact import MID, toy_model

ALIKE = cluster([4, 4], types=[MID, MID], intra_Bps=10e9, net_Bps=1.25e9, latency_s=1e-5)


def _ed(c=ALIKE):
    space = SearchSpace(policies=("ED",), nm_values=(4,), waves=12, workers=1, sim_max_gpus=0)
    return next(x for x in search_plans(c, toy_model(), space).candidates if x.feasible), space


def test_a_pull_costs_its_time_alone_on_idle_links_and_the_shared_time_on_busy_ones():
    ed, _ = _ed()
    parts, topology = list(ed.partitions), Topology(ALIKE)
    routes, capacity = PsRoutes(topology), topology.capacity_Bps
    idle = pull_s(parts, topology, routes, {l: 0.0 for l in capacity})
    alone = [[max(w * f / capacity[l] for l, f in routes.pull(g).items()) for g, w in zip(p.gpus, p.param_bytes)]
             for p in parts]
    assert idle == [pytest.approx(row) for row in alone]
    assert pull_s(parts, topology, routes, {l: 1.0 for l in capacity}) == pull_s(parts, topology, routes)
    half = pull_s(parts, topology, routes, {l: 0.5 for l in capacity})
    shared = pull_s(parts, topology, routes)
    assert all(a <= h <= s for ra, rh, rs in zip(alone, half, shared) for a, h, s in zip(ra, rh, rs))
    assert any(a < s for ra, rs in zip(alone, shared) for a, s in zip(ra, rs))   # the VWs do share links


def test_spread_pulls_track_the_simulator_better_than_pulls_all_at_once():
    ed, space = _ed()
    parts, topology = list(ed.partitions), Topology(ALIKE)
    shared = pull_s(parts, topology)
    at_once = len(parts) * min(4 / max(p.roundtrip_s, max(4 * t + q for t, q in zip(p.stage_s, shared[i])))
                               for i, p in enumerate(parts))
    estimate = wsp_estimate(parts, 4, topology).minibatches_per_s
    simulated = _simulate((ALIKE, toy_model(), ed.plan, space)).mb_s
    assert abs(estimate - simulated) <= 0.02 * simulated
    assert abs(estimate - simulated) < abs(at_once - simulated)
    assert estimate <= len(parts) * min(4 / p.roundtrip_s for p in parts)      # never above the bound


def test_unequal_vws_pull_together_when_the_wsp_gate_opens():
    # Fast VWs wait at the gate for the slowest one's push, then all pull at once: the shared pulls.
    from test_search_exact import FAST, SLOW
    c = cluster([2, 2], types=[FAST, SLOW], intra_Bps=10e9, net_Bps=1.25e9, latency_s=1e-5)
    space = SearchSpace(policies=("NP",), nm_values=(4,), workers=1, sim_max_gpus=0)
    np_ = next(x for x in search_plans(c, toy_model(), space).candidates if x.feasible)
    parts, topology = list(np_.partitions), Topology(c)
    shared = pull_s(parts, topology)
    rates = [4 / max(p.roundtrip_s, max(4 * t + q for t, q in zip(p.stage_s, shared[i]))) for i, p in enumerate(parts)]
    capacity, loads = topology.capacity_Bps, link_loads(parts, 4, topology)
    expected = len(parts) * min(min(rates), min(capacity[l] / b for l, b in loads.items() if b > 0))
    assert wsp_estimate(parts, 4, topology).minibatches_per_s == pytest.approx(expected)


def test_bsp_pipelines_cost_a_flush_wave_plus_the_all_reduce_left_after_the_backward_drain():
    space = SearchSpace(policies=("ED", "NP"), nm_values=(2, 4), sync="bsp", schedule="1f1b-flush", waves=10,
                        workers=1, sim_max_gpus=0)
    candidates = [c for c in search_plans(ALIKE, toy_model(), space).candidates if c.feasible]
    assert len(candidates) == 4
    for c in candidates:
        parts, topology = list(c.partitions), Topology(ALIKE)
        estimate = bsp_pipeline_estimate(parts, c.nm, topology).minibatches_per_s
        wave = max(p.roundtrip_s + (c.nm - 1) * p.bottleneck_s for p in parts)
        assert estimate < len(parts) * c.nm / wave                      # the all-reduce costs something
        simulated = _simulate((ALIKE, toy_model(), c.plan, space)).mb_s
        # Within 8 % (a 1F1B flush can be shorter than roundtrip + (Nm - 1) x the slowest stage), and
        # much nearer than the WSP estimate the search ranked BSP candidates by before.
        assert abs(estimate - simulated) <= 0.08 * simulated, c.policy
        wsp = wsp_estimate(parts, c.nm, topology).minibatches_per_s
        assert abs(estimate - simulated) < abs(wsp - simulated) / 3


def _deepspeed_iteration_s(stages: int, m: int, x: float, fwd: float = 0.010, bwd: float = 0.020,
                           blocking: bool = False) -> tuple[float, float]:
    """(estimated, simulated) seconds per iteration of one DeepSpeed pipeline, transfers X long."""
    from dataclasses import replace

    import hetsim
    from conftest import plan, profile
    from hetsim.planner.estimate import bsp_estimate, plan_partitions
    c = cluster([stages], intra_Bps=1e8)
    p = profile(stages, fwd, bwd, out_bytes=int(x * 1e8))
    pl = plan([[f"node0/gpu{i}" for i in range(stages)]], list(range(stages + 1)), nm=m, schedule="1f1b-deepspeed")
    pl = replace(pl, blocking_p2p=blocking)
    estimate = bsp_estimate(plan_partitions(pl, c, p), m, 0, 1.0).minibatches_per_s
    return m / estimate, m / hetsim.simulate(c, p, pl, waves=6, trace=False).throughput["minibatches_per_s"]


@pytest.mark.parametrize("m", [1, 5])
def test_the_estimate_counts_both_transfers_across_a_boundary_under_deepspeed_rendezvous(m):
    """DeepSpeed's rendezvous holds sender and receiver for every transfer, so an end stage waits out
    2X a minibatch: the flush estimate (roundtrip + (m - 1) bottleneck) is then the simulated
    iteration, (m + 1)(F + B) + 2mX on two stages."""
    estimated, simulated = _deepspeed_iteration_s(2, m, 0.004)
    assert estimated == pytest.approx(simulated, rel=1e-9)
    assert estimated == pytest.approx((m + 1) * 0.030 + 2 * m * 0.004, rel=1e-9)


def test_the_estimate_charges_a_deepspeed_middle_stage_four_transfers_per_minibatch():
    """Each further minibatch adds the bottleneck, F + B + 4X for a middle stage, in both; their fills
    differ (by 2X here), under 2 % at m = 8. Counting one transfer per boundary was 10 % short."""
    (e8, s8), (e9, s9) = _deepspeed_iteration_s(4, 8, 0.004), _deepspeed_iteration_s(4, 9, 0.004)
    assert e9 - e8 == pytest.approx(0.030 + 4 * 0.004, rel=1e-9)
    assert s9 - s8 == pytest.approx(e9 - e8, rel=1e-6)
    assert e8 == pytest.approx(s8, rel=0.02)


@pytest.mark.parametrize("m", [1, 5, 9])
def test_the_estimate_of_two_deepspeed_stages_with_blocking_sends_is_the_simulated_iteration(m):
    """With blocking_p2p the last stage costs F + B + 2X a minibatch (its gradient send, and the
    activation that leaves the stage before only after taking that gradient): exact on two stages."""
    estimated, simulated = _deepspeed_iteration_s(2, m, 0.004, blocking=True)
    assert estimated == pytest.approx(simulated, rel=1e-9)


@pytest.mark.parametrize("m", [5, 8])
def test_the_estimate_charges_a_blocking_deepspeed_middle_stage_three_transfers(m):
    """A middle stage: its two sends and the activation it waits for, F + B + 3X per further
    minibatch in both; the fills differ by one transfer."""
    (e, s), (e1, s1) = (_deepspeed_iteration_s(4, m, 0.004, blocking=True),
                        _deepspeed_iteration_s(4, m + 1, 0.004, blocking=True))
    assert e1 - e == pytest.approx(0.030 + 3 * 0.004, rel=1e-9)
    assert s1 - s == pytest.approx(e1 - e, rel=1e-9)
    assert e - s == pytest.approx(0.004, rel=1e-6)
