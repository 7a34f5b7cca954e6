"""PipeDream's DP equals brute-force enumeration; literal tables for replication and hierarchy."""

import itertools

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from hetsim.errors import PlanError
from hetsim.planner.chain import chain_costs, hierarchical_partition, pipedream_partition, stage_time


def brute_force(compute, params, cuts, n_gpus, bandwidth, replication=True):
    """Every split into contiguous stages and every replica count per stage, at most n_gpus GPUs."""
    n = len(compute)
    best = np.inf
    for k in range(1, min(n, n_gpus) + 1):             # every stage needs a GPU of its own
        for inner in itertools.combinations(range(1, n), k - 1):
            bounds = (0, *inner, n)
            for reps in itertools.product(range(1, n_gpus + 1) if replication else (1,), repeat=k):
                if sum(reps) > n_gpus:
                    continue
                t = [stage_time(sum(compute[a:b]), sum(params[a:b]), r, bandwidth)
                     for a, b, r in zip(bounds, bounds[1:], reps)]
                t += [2 * cuts[c] / bandwidth for c in inner]
                best = min(best, max(t))
    return best


# Issue 4's small cases: up to 8 layers on up to 4 GPUs.
MAX_LAYERS, MAX_GPUS = 8, 4

chains = st.integers(1, MAX_LAYERS).flatmap(lambda n: st.tuples(
    st.lists(st.floats(0.0, 10.0), min_size=n, max_size=n),
    st.lists(st.floats(0.0, 1e9), min_size=n, max_size=n),
    st.lists(st.floats(0.0, 1e9), min_size=n + 1, max_size=n + 1)))

# The largest case on every run, whatever hypothesis draws: uneven layers, one huge weight, cheap cuts.
EIGHT_LAYERS = ([3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0], [0.0, 1e8, 0.0, 9e8, 2e7, 0.0, 5e8, 1e6],
                [0.0, 3e7, 1e8, 2e6, 4e8, 1e7, 5e7, 1e5, 0.0])


@settings(max_examples=200, deadline=None)
@given(chain=chains, n_gpus=st.integers(1, MAX_GPUS), bandwidth=st.sampled_from([1e8, 1e9, 1e10]),
       replication=st.booleans())
@example(chain=EIGHT_LAYERS, n_gpus=MAX_GPUS, bandwidth=1e9, replication=True)
@example(chain=EIGHT_LAYERS, n_gpus=MAX_GPUS, bandwidth=1e10, replication=False)
def test_dp_optimum_equals_brute_force(chain, n_gpus, bandwidth, replication):
    compute, params, cuts = chain
    part = pipedream_partition(chain_costs(compute, params, cuts), n_gpus, bandwidth_Bps=bandwidth,
                               replication=replication)
    assert part.bottleneck_s == pytest.approx(brute_force(compute, params, cuts, n_gpus, bandwidth,
                                                          replication), rel=1e-9, abs=1e-12)
    assert part.gpus <= n_gpus
    assert part.boundaries[0] == 0 and part.boundaries[-1] == len(compute)


def test_equal_layers_split_evenly_without_replication():
    part = pipedream_partition(chain_costs([1, 1, 1, 1], [0] * 4, [0] * 5), 2, bandwidth_Bps=1e9,
                               replication=False)
    assert part.boundaries == (0, 2, 4)
    assert part.bottleneck_s == 2.0


def test_weightless_layers_are_replicated_like_data_parallelism():
    # No weights to all-reduce: one stage on 4 replicas takes 8 / 4.
    part = pipedream_partition(chain_costs([4, 4], [0, 0], [0, 1e12, 0]), 4, bandwidth_Bps=1e9)
    assert [(s.states, s.replicas) for s in part.stages] == [((0, 2), 4)]
    assert part.bottleneck_s == 2.0


def test_heavy_weights_keep_a_stage_unreplicated():
    # VGG-like: a cheap layer with huge weights (all-reduce 4(r-1)|w|/(rB)) stays on one GPU.
    part = pipedream_partition(chain_costs([6, 1], [0, 4e9], [0, 0, 0]), 4, bandwidth_Bps=1e9)
    assert [(s.states, s.replicas) for s in part.stages] == [((0, 1), 3), ((1, 2), 1)]
    assert part.bottleneck_s == 2.0


def test_one_level_hierarchy_is_the_flat_dp():
    costs = chain_costs([3, 1, 2, 5], [1e8, 0, 5e8, 1e7], [0, 1e8, 2e8, 1e7, 0])
    flat = pipedream_partition(costs, 4, bandwidth_Bps=1e9)
    assert hierarchical_partition(costs, [(4, 1e9)]).bottleneck_s == flat.bottleneck_s


def test_hierarchy_replicates_inside_fast_servers_and_pipelines_across_slow_links():
    # Two layers with 1 GB of weights each; PCIe-like 1 TB/s inside a server, 1 GB/s between two.
    # Replicating the model across servers all-reduces 2 GB over the slow link (max(2, 4)/2 = 2);
    # a stage per server, replicated on its two GPUs, takes max(2, 0.002)/2 = 1.
    costs = chain_costs([2, 2], [1e9, 1e9], [0, 0, 0])
    part = hierarchical_partition(costs, [(2, 1e12), (2, 1e9)])
    assert part.bottleneck_s == pytest.approx(1.0)
    assert part.boundaries == (0, 1, 2)


def test_zero_gpus_is_an_error():
    with pytest.raises(PlanError, match="n_gpus"):
        pipedream_partition(chain_costs([1], [0], [0, 0]), 0, bandwidth_Bps=1e9)


def brute_force_two_levels(compute, params, cuts, inner, outer):
    """Outer stages of r whole servers each; a server's time on a range is the inner optimum."""
    (g1, b1), (g2, b2) = inner, outer
    n = len(compute)
    best = np.inf
    for k in range(1, min(n, g2) + 1):                  # every outer stage needs a server of its own
        for split in itertools.combinations(range(1, n), k - 1):
            bounds = (0, *split, n)
            for reps in itertools.product(range(1, g2 + 1), repeat=k):
                if sum(reps) > g2:
                    continue
                t = []
                for a, b, r in zip(bounds, bounds[1:], reps):
                    group = brute_force(compute[a:b], params[a:b], [0.0] + list(cuts[a + 1:b]) + [0.0], g1, b1)
                    t.append(max(group, 4 * (r - 1) * sum(params[a:b]) / (r * b2)) / r)
                t += [2 * cuts[c] / b2 for c in split]
                best = min(best, max(t))
    return best


# GPUs per server x servers: every shape of at most MAX_GPUS GPUs in all.
shapes = st.sampled_from([(g1, g2) for g1 in range(1, MAX_GPUS + 1) for g2 in range(1, MAX_GPUS + 1)
                          if g1 * g2 <= MAX_GPUS])


@settings(max_examples=100, deadline=None)
@given(chain=chains, shape=shapes, b1=st.sampled_from([1e9, 1e10]), b2=st.sampled_from([1e8, 1e9]))
@example(chain=EIGHT_LAYERS, shape=(2, 2), b1=1e10, b2=1e8)
@example(chain=EIGHT_LAYERS, shape=(4, 1), b1=1e10, b2=1e8)
@example(chain=EIGHT_LAYERS, shape=(1, 4), b1=1e9, b2=1e9)
def test_two_level_hierarchy_equals_brute_force(chain, shape, b1, b2):
    g1, g2 = shape
    compute, params, cuts = chain
    part = hierarchical_partition(chain_costs(compute, params, cuts), [(g1, b1), (g2, b2)])
    assert part.bottleneck_s == pytest.approx(
        brute_force_two_levels(compute, params, cuts, (g1, b1), (g2, b2)), rel=1e-9, abs=1e-12)
