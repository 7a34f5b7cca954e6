"""The heterogeneous partitioner equals brute force; whimpy GPUs pool memory; clear "does not fit"."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from conftest import cluster, gpu_type
from hetsim.errors import PlanError
from hetsim.memory import MemorySettings, stage_memory
from hetsim.plan import ASYNC_SCHEDULES, OPTIMIZERS, PRECISIONS
from hetsim.planner.hetero import gpu_orders, held, partition_ordered, partition_vw
from hetsim.profile import LayerProfile, ModelProfile
from hetsim.topology import Topology

FAST, SLOW = gpu_type("fast", memory_gib=1.0), gpu_type("slow", memory_gib=0.5)
GB = 2**30


def two_type_profile(fast_s, slow_s, params, outputs):
    layers = tuple(LayerProfile(name=f"l{i}", kind="x", param_bytes=int(p), output_bytes=int(o),
                                fwd_s={"fast": f / 3, "slow": s / 3}, bwd_s={"fast": 2 * f / 3, "slow": 2 * s / 3})
                   for i, (f, s, p, o) in enumerate(zip(fast_s, slow_s, params, outputs)))
    return ModelProfile(model="m", batch_size=1, layers=layers,
                        edges=tuple((i, i + 1) for i in range(len(layers) - 1)), input_bytes=int(outputs[0]))


def brute_force_ordered(p, gpus, topology, nm, schedule, memory=MemorySettings()):
    n, k = p.n_layers, len(gpus)
    wire = {"fp16": 0.5, "bf16": 0.5}.get(memory.precision, 1.0)
    link = lambda a, b, c: (topology.route(a.id, b.id).latency_s
                            + wire * p.cut_bytes(c) / topology.bottleneck_Bps(a.id, b.id))
    best = np.inf
    for inner in itertools.combinations(range(1, n), k - 1):
        b = (0, *inner, n)
        times = []
        for s, g in enumerate(gpus):
            flight, deferred = held(schedule, k, s, nm)
            mem = stage_memory(p, b[s], b[s + 1], in_flight=flight, deferred=deferred,
                               asynchronous=schedule in ASYNC_SCHEDULES, settings=memory)
            if mem.total_bytes > g.type.memory_bytes:
                break
            fwd, bwd = p.stage_times(g.type.name, b[s], b[s + 1])
            t = fwd * (2 if memory.recompute else 1) + bwd
            t += link(gpus[s - 1], g, b[s]) if s else 0.0
            t += link(g, gpus[s + 1], b[s + 1]) if s + 1 < k else 0.0
            times.append(t)
        else:
            best = min(best, max(times))
    return best


@st.composite
def cases(draw):
    n = draw(st.integers(1, 8))
    fast = draw(st.lists(st.floats(0.001, 1.0), min_size=n, max_size=n))
    slow = [f * draw(st.floats(1.0, 4.0)) for f in fast]
    params = draw(st.lists(st.integers(0, GB // 16), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(0, GB // 16), min_size=n, max_size=n))
    counts = draw(st.lists(st.integers(0, 2), min_size=2, max_size=2).filter(lambda c: 1 <= sum(c) <= min(4, n)))
    return two_type_profile(fast, slow, params, outputs), counts


def make_cluster(counts):
    nodes = [(c, t) for c, t in zip(counts, (FAST, SLOW)) if c]
    return cluster([c for c, _ in nodes], types=[t for _, t in nodes], intra_Bps=8e9, net_Bps=1e9,
                   latency_s=1e-5)


memories = st.builds(MemorySettings, optimizer=st.sampled_from((None,) + OPTIMIZERS),
                     precision=st.sampled_from(PRECISIONS), recompute=st.booleans())


@settings(max_examples=150, deadline=None)
@given(case=cases(), nm=st.integers(1, 4), schedule=st.sampled_from(["hetpipe", "1f1b", "1f1b-flush"]),
       memory=memories)
def test_ordered_split_equals_brute_force(case, nm, schedule, memory):
    p, counts = case
    c = make_cluster(counts)
    gpus, topology = list(c.gpus), Topology(c)
    expected = brute_force_ordered(p, gpus, topology, nm, schedule, memory)
    if not np.isfinite(expected):
        with pytest.raises(PlanError, match="does not fit"):
            partition_ordered(p, gpus, topology, nm=nm, schedule=schedule, memory=memory)
        return
    part = partition_ordered(p, gpus, topology, nm=nm, schedule=schedule, memory=memory)
    assert part.bottleneck_s == pytest.approx(expected, rel=1e-9)
    assert all(m <= c.gpu(g).type.memory_bytes for g, m in zip(part.gpus, part.memory_bytes))


@settings(max_examples=80, deadline=None)
@given(case=cases(), nm=st.integers(1, 3))
def test_best_gpu_order_equals_brute_force_over_permutations(case, nm):
    p, counts = case
    c = make_cluster(counts)
    topology = Topology(c)
    expected = min(brute_force_ordered(p, list(order), topology, nm, "hetpipe")
                   for order in itertools.permutations(c.gpus))
    if not np.isfinite(expected):
        with pytest.raises(PlanError, match="does not fit"):
            partition_vw(p, list(c.gpus), topology, nm=nm)
        return
    assert partition_vw(p, list(c.gpus), topology, nm=nm).bottleneck_s == pytest.approx(expected, rel=1e-9)


def test_a_gpu_twice_as_fast_takes_twice_the_layers():
    p = two_type_profile([1, 1, 1], [2, 2, 2], [0] * 3, [0] * 3)
    c = cluster([1, 1], types=[FAST, SLOW], intra_Bps=1e18, net_Bps=1e18)
    part = partition_vw(p, list(c.gpus), Topology(c), nm=1)
    assert part.gpus == ("node0/gpu0", "node1/gpu0")
    assert part.boundaries == (0, 2, 3)
    assert part.stage_s == pytest.approx((2.0, 2.0))


def test_16_bit_activations_cross_links_at_half_the_bytes_and_can_move_the_cut():
    # Layer times 2, 1, 1 s; the cut after layer 0 takes 1.5 s at FP32, after layer 1 nothing. At FP32
    # cutting after layer 1 is best (3 s against 2 + 1.5); in 16 bits the first cut costs 0.75 s and wins.
    p = two_type_profile([2, 1, 1], [2, 1, 1], [0] * 3, [1_500_000, 0, 0])
    c = cluster([1, 1], types=[FAST, FAST], intra_Bps=1e18, net_Bps=1e6)
    parts = {precision: partition_ordered(p, list(c.gpus), Topology(c), nm=1,
                                          memory=MemorySettings(precision=precision))
             for precision in PRECISIONS}
    for precision in ("fp32", "tf32"):
        assert parts[precision].boundaries == (0, 2, 3)
        assert parts[precision].bottleneck_s == pytest.approx(3.0)
    for precision in ("fp16", "bf16"):
        assert parts[precision].boundaries == (0, 1, 3)
        assert parts[precision].transfer_bytes == (750_000,)
        assert parts[precision].transfer_s == pytest.approx((0.75,))
        assert parts[precision].bottleneck_s == pytest.approx(2.75)


@pytest.mark.parametrize("optimizer,precision,fits", [(None, "fp32", True), ("momentum", "fp32", True),
                                                      ("adam", "fp32", False), ("sgd", "bf16", True),
                                                      ("adamw", "bf16", False)])
def test_the_optimizer_and_precision_decide_whether_a_stage_fits(optimizer, precision, fits):
    # 0.3 GiB of FP32 weights on a 1 GiB GPU: weights, gradients and one momentum copy take 0.9 GiB;
    # Adam's two copies 1.2; bf16 with SGD 0.15 + 0.3 + an FP32 master copy 0.3; bf16 Adam 1.35.
    p = two_type_profile([1], [1], [0.3 * GB], [0])
    c = cluster([1], types=[FAST])
    memory = MemorySettings(optimizer=optimizer, precision=precision)
    if fits:
        assert partition_vw(p, list(c.gpus), Topology(c), nm=1, memory=memory).memory_bytes[0] <= GB
    else:
        with pytest.raises(PlanError, match="does not fit"):
            partition_vw(p, list(c.gpus), Topology(c), nm=1, memory=memory)


def test_orders_treat_same_type_same_node_gpus_as_interchangeable():
    c = cluster([2, 2], types=[FAST, SLOW])
    assert len(gpu_orders(list(c.gpus))) == 6          # 4! / (2! 2!)
    assert len(gpu_orders(list(c.gpus), max_orders=5)) == 2   # then node blocks only


def test_whimpy_gpus_hold_together_what_none_holds_alone():
    # 8 layers of 100 MiB weights, held 4 times (weights, gradients, momentum, one stash at Nm=2):
    # 3.1 GiB on one GPU and 1.6 GiB on each of two exceed a "fast" GPU's 1 GiB; four hold 0.8 each.
    p = two_type_profile([1] * 8, [2] * 8, [100 * 2**20] * 8, [2**20] * 8)
    c = cluster([4], types=[FAST])
    topology = Topology(c)
    with pytest.raises(PlanError, match="does not fit node0/gpu0"):
        partition_vw(p, [c.gpus[0]], topology, nm=2)
    part = partition_vw(p, list(c.gpus), topology, nm=2)
    assert part.boundaries == (0, 2, 4, 6, 8)
    with pytest.raises(PlanError, match=r"does not fit .*holding 1 minibatch\(es\).*; lower Nm, add GPUs, raise "
                                        r"tensor parallelism \(--tp\) or recompute activations \(--recompute\)$"):
        partition_vw(p, list(c.gpus)[:2], topology, nm=2)


def test_a_plan_that_does_not_fit_counts_one_gpu_as_its_schedule_would_hold_it_and_hints_only_what_helps():
    p = two_type_profile([1] * 8, [2] * 8, [100 * 2**20] * 8, [2**20] * 8)
    c = cluster([4], types=[FAST])
    for schedule, held in (("1f1b-flush", 1), ("gpipe", 4)):          # one stage of 1F1B holds one; GPipe Nm
        with pytest.raises(PlanError) as flush:
            partition_vw(p, list(c.gpus)[:2], Topology(c), nm=4, schedule=schedule)
        assert f"holding {held} minibatch(es)" in str(flush.value)
    with pytest.raises(PlanError) as one:
        partition_vw(p, [c.gpus[0]], Topology(c), nm=1)
    assert "lower Nm" not in str(one.value) and str(one.value).endswith("add GPUs, raise tensor parallelism (--tp) "
                                                                        "or recompute activations (--recompute)")


@settings(max_examples=60, deadline=None)
@given(k=st.integers(1, 5), nm=st.integers(1, 6),
       costs=st.lists(st.tuples(st.floats(0.01, 1.0), st.floats(0.01, 2.0), st.floats(0.0, 0.5)),
                      min_size=5, max_size=5),
       schedule=st.sampled_from(["hetpipe", "1f1b", "1f1b-flush", "gpipe"]))
def test_in_flight_bounds_what_the_schedule_holds(k, nm, costs, schedule):
    from hetsim.schedule import build_schedule
    built = build_schedule(schedule, k, nm, 4, "none", tuple(costs[:k]) if schedule == "hetpipe" else None)
    for s in range(k):
        assert built.in_flight(s) <= held(schedule, k, s, nm)[0]


def test_beyond_max_orders_a_swap_search_still_finds_a_balanced_order():
    # Four single-GPU nodes, types alternating: 24 orders; with max_orders=5 neither the orders nor
    # the 4! node-block orders are enumerated, and the swap search must still match the optimum here.
    types = [FAST, SLOW, FAST, SLOW]
    c = cluster([1, 1, 1, 1], types=types, intra_Bps=8e9, net_Bps=1e9, latency_s=1e-5)
    p = two_type_profile([0.1, 0.3, 0.2, 0.4, 0.1, 0.2, 0.3, 0.1], [0.3, 0.5, 0.6, 0.5, 0.4, 0.6, 0.3, 0.2],
                         [2**20] * 8, [2**24, 2**22, 2**25, 2**20, 2**23, 2**21, 2**20, 2**22])
    topology = Topology(c)
    assert gpu_orders(list(c.gpus), max_orders=5) is None
    exhaustive = partition_vw(p, list(c.gpus), topology, nm=2)
    local = partition_vw(p, list(c.gpus), topology, nm=2, max_orders=5)
    assert local.bottleneck_s == pytest.approx(exhaustive.bottleneck_s)
