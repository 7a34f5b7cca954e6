"""Tensor-parallel stages: closed forms of compute division, activation all-reduces and DP rings."""

from dataclasses import replace

import pytest

from conftest import cluster, profile
from hetsim.plan import Plan, StageSpec, SyncSpec, VirtualWorker
from hetsim.profile import tp_key
from hetsim.sim import SimOptions, run_simulation


def tp_plan(groups: list[list[list[str]]], splits: list[int], *, nm: int, sync: str = "none") -> Plan:
    """groups[v][s]: the GPUs of stage s of virtual worker v (the first leads the TP group)."""
    return Plan(name="tp", model="synthetic", minibatch_size=1, nm=nm, schedule="1f1b-flush",
                sync=SyncSpec(mode=sync), virtual_workers=tuple(
                    VirtualWorker(name=f"vw{v}", stages=tuple(
                        StageSpec(gpu=g[0], tp_gpus=tuple(g[1:]), layers=(splits[s], splits[s + 1]))
                        for s, g in enumerate(stages)))
                    for v, stages in enumerate(groups)))


def run(c, p, pl, waves=6):
    return run_simulation(c, p, pl, SimOptions(waves=waves, warmup_waves=1, trace=False))


@pytest.mark.parametrize("t", [2, 4, 8])
def test_t_identical_gpus_with_free_links_divide_compute_by_t(t):
    c = cluster([8])
    p = profile(2, 0.010, 0.020)
    one = run(c, p, tp_plan([[["node0/gpu0"]]], [0, 2], nm=4))
    group = run(c, p, tp_plan([[[f"node0/gpu{k}" for k in range(t)]]], [0, 2], nm=4))
    assert group.throughput["minibatches_per_s"] == pytest.approx(t * one.throughput["minibatches_per_s"], rel=1e-9)
    assert {g.id for g in group.gpus} == {f"node0/gpu{k}" for k in range(t)}
    assert all(g.tp == t and g.busy_fraction == pytest.approx(1.0) for g in group.gpus)


def test_activation_allreduce_of_each_pass_crosses_the_links_as_a_ring():
    t, nbytes, bw = 4, 8_000_000, 1e9
    c = cluster([t], intra_Bps=bw)
    base = profile(1, 0.010, 0.020)
    p = replace(base, layers=(replace(base.layers[0], tp_allreduce_bytes=nbytes),))
    report = run(c, p, tp_plan([[[f"node0/gpu{k}" for k in range(t)]]], [0, 1], nm=1), waves=5)
    # Each pass: a ring all-reduce, 2(t-1) steps of nbytes/t on every GPU's outgoing link.
    ring_s = 2 * (t - 1) * (nbytes / t) / bw
    per_minibatch = (0.010 + 0.020) / t + 2 * ring_s
    assert report.throughput["minibatches_per_s"] == pytest.approx(1 / per_minibatch, rel=1e-6)
    out = {l.id: l.bytes for l in report.links}["node0/gpu0:out"]
    minibatches = report.virtual_workers[0].minibatches
    assert out == pytest.approx(minibatches * 2 * 2 * (t - 1) * nbytes / t, rel=1e-6)


@pytest.mark.parametrize("calls", [1, 5])
def test_each_allreduce_call_pays_its_steps_latency_and_the_links_collective_latency(calls):
    t, nbytes, bw, step, fixed = 4, 8_000_000, 1e9, 50e-6, 400e-6
    base_c = cluster([t], intra_Bps=bw, latency_s=step)
    node = base_c.nodes[0]
    c = replace(base_c, nodes=(replace(node, intra_link=replace(node.intra_link, collective_latency_s=fixed)),))
    base = profile(1, 0.010, 0.020)
    p = replace(base, layers=(replace(base.layers[0], tp_allreduce_bytes=nbytes, tp_allreduce_calls=calls),))
    report = run(c, p, tp_plan([[[f"node0/gpu{k}" for k in range(t)]]], [0, 1], nm=1), waves=5)
    # `calls` rings of nbytes/calls: each 2(t-1) steps of latency + its share of the bytes, + the fixed cost.
    per_pass = calls * (2 * (t - 1) * (step + nbytes / calls / t / bw) + fixed)
    assert report.throughput["minibatches_per_s"] == pytest.approx(1 / ((0.010 + 0.020) / t + 2 * per_pass),
                                                                   rel=1e-6)
    # The planner's estimate prices a pass the same way.
    from hetsim.topology import Topology
    assert Topology(c).tp_pass_s("node0", t, nbytes, calls) == pytest.approx(per_pass, rel=1e-12)


def test_a_lookup_all_reduces_only_forward_and_a_head_only_backward():
    # Megatron's split: a vocabulary-parallel lookup (g: forward only) on stage 0, a column-parallel
    # head (f: its input's gradient, backward only) on stage 1. Each stage's passes pay their own ring.
    t, nbytes, bw = 2, 4_000_000, 1e9
    c = cluster([2 * t], intra_Bps=bw)
    base = profile(2, 0.010, 0.020)
    p = replace(base, layers=(replace(base.layers[0], tp_allreduce_bytes=nbytes, tp_allreduce_bwd_bytes=0),
                              replace(base.layers[1], tp_allreduce_bwd_bytes=3 * nbytes, tp_allreduce_bwd_calls=3)))
    assert [p.stage_tp_allreduce_bytes(0, 2, backward) for backward in (False, True)] == [nbytes, 3 * nbytes]
    assert [p.stage_tp_allreduce_calls(0, 2, backward) for backward in (False, True)] == [1, 3]
    ring_s = lambda b: 2 * (t - 1) * (b / t) / bw
    lookup, head = ring_s(nbytes), ring_s(3 * nbytes)
    plan = tp_plan([[["node0/gpu0", "node0/gpu1"], ["node0/gpu2", "node0/gpu3"]]], [0, 1, 2], nm=1)
    report = run(c, p, plan, waves=5)
    # One minibatch in flight at a time (nm 1, free activation transfers between the stages).
    per_minibatch = 2 * (0.010 + 0.020) / t + lookup + head
    assert report.throughput["minibatches_per_s"] == pytest.approx(1 / per_minibatch, rel=1e-6)
    from hetsim.topology import Topology
    both = Topology(c).tp_passes_s("node0", t, p, 0, 2)
    assert both == pytest.approx(lookup + head, rel=1e-12)


@pytest.mark.parametrize("precision, wire", [("fp32", 4), ("tf32", 4), ("bf16", 2), ("fp16", 2)])
def test_activations_and_tp_all_reduces_cross_links_in_the_plans_precision(precision, wire):
    # Profiles count activations at FP32; a 16-bit plan sends 2 bytes an element between stages and
    # in its TP all-reduces. Two TP-2 stages, one minibatch in flight: compute, then each transfer alone.
    t, nbytes, bw = 2, 8_000_000, 1e9
    c = cluster([2, 2], intra_Bps=bw, net_Bps=bw)
    base = profile(2, 0.010, 0.020, out_bytes=nbytes)
    p = replace(base, layers=tuple(replace(l, tp_allreduce_bytes=nbytes) for l in base.layers))
    plan = replace(tp_plan([[["node0/gpu0", "node0/gpu1"], ["node1/gpu0", "node1/gpu1"]]], [0, 1, 2], nm=1),
                   precision=precision)
    report = run(c, p, plan, waves=5)
    moved = nbytes * wire / 4
    ring = 2 * (t - 1) * (moved / t) / bw
    per_minibatch = 2 * (0.010 + 0.020) / t + 4 * ring + 2 * moved / bw   # 4 passes' rings; act + grad
    assert report.throughput["minibatches_per_s"] == pytest.approx(1 / per_minibatch, rel=1e-6)
    from hetsim.planner.estimate import plan_partitions
    assert plan_partitions(plan, c, p)[0].transfer_bytes == (int(moved),)


@pytest.mark.parametrize("t", [1, 2])
def test_recomputation_runs_the_forward_and_its_all_reduces_again_in_the_backward(t):
    # Two stages of one layer each, one minibatch in flight: F, then B with the forward again inside.
    nbytes, bw = 8_000_000, 1e9
    c = cluster([2, 2], intra_Bps=bw, net_Bps=bw)
    base = profile(2, 0.010, 0.020, out_bytes=nbytes)
    p = replace(base, layers=tuple(replace(l, tp_allreduce_bytes=nbytes) for l in base.layers))
    groups = [[["node0/gpu0", "node0/gpu1"][:t], ["node1/gpu0", "node1/gpu1"][:t]]]
    plan = replace(tp_plan(groups, [0, 1, 2], nm=1), recompute=True)
    ring = 2 * (t - 1) * (nbytes / t) / bw
    per_minibatch = 2 * (2 * 0.010 + 0.020) / t + 6 * ring + 2 * nbytes / bw   # F, recomputed F, B per stage
    assert run(c, p, plan, waves=5).throughput["minibatches_per_s"] == pytest.approx(1 / per_minibatch, rel=1e-6)
    from hetsim.planner.estimate import plan_partitions
    assert plan_partitions(plan, c, p)[0].compute_s == pytest.approx(((2 * 0.010 + 0.020) / t + 3 * ring,) * 2)


def test_a_profile_without_call_counts_makes_one_call_per_layer_with_bytes():
    base = profile(3, 0.010, 0.020)
    layers = (replace(base.layers[0], tp_allreduce_bytes=10), replace(base.layers[1], tp_allreduce_bytes=10,
                                                                      tp_allreduce_calls=2), base.layers[2])
    p = replace(base, layers=layers)
    assert [l.tp_calls for l in p.layers] == [1, 2, 0]
    assert p.stage_tp_allreduce_calls(0, 3) == 3 and p.stage_tp_allreduce_calls(2, 3) == 0


def test_with_zero_latencies_the_planners_tp_pass_is_the_bytes_term_it_always_was():
    from hetsim.topology import Topology
    c = cluster([8], intra_Bps=37e9)
    topology = Topology(c)
    for tp, nbytes in ((2, 12_582_912), (4, 3 * 2**20 + 7), (8, 999_999_937)):
        assert 2 * topology.tp_pass_s("node0", tp, nbytes, 5) == 2 * 2 * (tp - 1) / tp * nbytes / 37e9


def test_times_measured_on_a_tp_group_are_used_as_they_are():
    c = cluster([4])
    base = profile(1, 0.010, 0.020)
    layer = base.layers[0]
    key = tp_key("test-gpu", 4)
    measured = replace(layer, fwd_s={**layer.fwd_s, key: 0.004}, bwd_s={**layer.bwd_s, key: 0.006},
                       tp_allreduce_bytes=10**12)           # would take ages if simulated on top
    report = run(c, replace(base, layers=(measured,)),
                 tp_plan([[[f"node0/gpu{k}" for k in range(4)]]], [0, 1], nm=1))
    assert report.throughput["minibatches_per_s"] == pytest.approx(1 / 0.010, rel=1e-9)


def test_data_parallel_rings_run_per_tp_rank_on_each_ranks_own_network_interface():
    nbytes, bw = 400_000_000, 1e9
    base = cluster([2, 2], net_Bps=bw)
    c = replace(base, nodes=tuple(replace(n, nic_per_gpu=True) for n in base.nodes))
    p = profile(1, 0.010, 0.020, param_bytes=nbytes)
    pl = tp_plan([[["node0/gpu0", "node0/gpu1"]], [["node1/gpu0", "node1/gpu1"]]], [0, 1], nm=1, sync="bsp")
    report = run(c, p, pl)
    # Two rings (one per TP rank) of 2 members, each reducing nbytes/2 on its own 1 GB/s interface.
    ring_s = 2 * (2 - 1) * (nbytes / 2 / 2) / bw
    wave = (0.010 + 0.020) / 2 + ring_s
    assert report.throughput["iteration_s"] == pytest.approx(wave, rel=1e-6)


def test_a_tp_group_across_nodes_or_types_is_refused():
    from hetsim.errors import PlanError
    from hetsim.sim import run_simulation as simulate
    c = cluster([2, 2])
    with pytest.raises(PlanError, match="spans nodes"):
        simulate(c, profile(1, 0.01, 0.02), tp_plan([[["node0/gpu0", "node1/gpu0"]]], [0, 1], nm=1))
