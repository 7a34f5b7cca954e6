"""The default (bounded) search finds the plan that simulating every candidate finds, on small clusters.

`SearchSpace(exhaustive=True)` is the reference: every feasible candidate simulated, the best
simulated rate wins. The default simulates best estimate first and skips candidates whose rate bound
is below the best simulated rate; these tests hold it to the same answer, and the bound to what the
simulator measures.
"""

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import cluster, gpu_type, plan, profile
from hetsim.errors import PlanError
from hetsim.planner.estimate import plan_partitions, rate_bound
from hetsim.planner.search import SearchSpace, _simulate, search_plans
from hetsim.profile import LayerProfile, ModelProfile
from hetsim.sim import SimOptions, run_simulation

FAST, MID, SLOW = gpu_type("fast", 2.0), gpu_type("mid", 1.5), gpu_type("slow", 0.75)
SPEED = {"fast": 1.0, "mid": 1.6, "slow": 2.5}


def toy_model(n: int = 8, param_mib: int = 20, act_mib: int = 8) -> ModelProfile:
    """Layers of uneven cost, slower by a per-type factor that differs a little layer to layer."""
    layers = tuple(LayerProfile(name=f"l{i}", kind="x", param_bytes=param_mib * 2**20, output_bytes=act_mib * 2**20,
                                fwd_s={t: (0.010 + 0.002 * i) * f * (1 + 0.1 * (i % 2)) for t, f in SPEED.items()},
                                bwd_s={t: (0.020 + 0.004 * i) * f * (1 + 0.1 * (i % 3)) for t, f in SPEED.items()})
                   for i in range(n))
    return ModelProfile(model="toy", batch_size=8, layers=layers,
                        edges=tuple((i, i + 1) for i in range(n - 1)), input_bytes=act_mib * 2**20)


def both(c, p, **space):
    base = SearchSpace(waves=10, workers=1, **space)
    return search_plans(c, p, base), search_plans(c, p, dataclasses.replace(base, exhaustive=True))


def assert_same_best(fast, full):
    # The same plan, or (a tie) one the simulator rates exactly as high.
    assert fast.best.plan == full.best.plan or fast.best.simulated_mb_s == full.best.simulated_mb_s
    assert fast.best.simulated_mb_s == full.best.simulated_mb_s
    assert fast.simulated <= full.simulated


CASES = {
    "homogeneous 2x2, auto+horovod": (cluster([2, 2], types=[MID, MID], intra_Bps=10e9, net_Bps=1.25e9,
                                              latency_s=1e-5), dict(policies=("auto", "horovod"))),
    "mixed fast/slow, NP/ED/HD, D 0 and 2": (cluster([2, 2], types=[FAST, SLOW], intra_Bps=10e9, net_Bps=1.25e9,
                                                     latency_s=1e-5),
                                             dict(policies=("NP", "ED", "HD"), staleness_values=(0, 2))),
    "three types, Nm 1/2/4": (cluster([2, 2, 2], types=[FAST, MID, SLOW], intra_Bps=10e9, net_Bps=3e9),
                              dict(policies=("auto",), nm_values=(1, 2, 4))),
    "one node of four, horovod only": (cluster([4], types=[FAST], intra_Bps=10e9), dict(policies=("horovod",))),
    "mixed fast/slow, sync bsp, TP 1 and 2": (cluster([2, 2], types=[FAST, SLOW], intra_Bps=10e9, net_Bps=1.25e9,
                                                       latency_s=1e-5),
                                              dict(policies=("auto",), sync="bsp", schedule="1f1b-flush",
                                                   nm_values=(2, 4), tp_values=(1, 2))),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bounded_search_finds_the_exhaustive_best(name):
    c, space = CASES[name]
    fast, full = both(c, toy_model(), **space)
    assert_same_best(fast, full)


def test_bounded_search_simulates_fewer_candidates_on_a_real_sized_case():
    c, space = CASES["three types, Nm 1/2/4"]
    fast, full = both(c, toy_model(), **space)
    assert fast.simulated < full.simulated / 2


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.lists(st.tuples(st.sampled_from([FAST, MID, SLOW]), st.integers(1, 3)), min_size=1, max_size=3),
       net_gbit=st.sampled_from([10.0, 100.0]), nm=st.sampled_from([(1, 2), (2, 4), (1, 4, 8)]),
       staleness=st.sampled_from([(0,), (0, 2)]), horovod=st.booleans())
def test_bounded_search_matches_exhaustive_on_generated_clusters(nodes, net_gbit, nm, staleness, horovod):
    c = cluster([n for _, n in nodes], types=[t for t, _ in nodes], intra_Bps=20e9, net_Bps=net_gbit * 1e9 / 8,
                latency_s=5e-6)
    policies = ("auto", "horovod") if horovod else ("auto",)
    try:
        fast, full = both(c, toy_model(), policies=policies, nm_values=nm, staleness_values=staleness)
    except PlanError:                           # nothing fits: the exhaustive search must say so too
        with pytest.raises(PlanError):
            search_plans(c, toy_model(), SearchSpace(policies=policies, nm_values=nm, staleness_values=staleness,
                                                     waves=10, workers=1, exhaustive=True))
        return
    assert_same_best(fast, full)


def test_rate_bound_is_above_every_simulated_rate_up_to_the_slack():
    c, space = CASES["three types, Nm 1/2/4"]
    full = search_plans(c, toy_model(), SearchSpace(waves=10, workers=1, exhaustive=True, **space))
    slack = SearchSpace().bound_slack
    for x in full.candidates:
        if x.simulated_mb_s is not None:
            assert x.simulated_mb_s <= rate_bound(list(x.partitions), x.nm) * (1 + slack), (x.policy, x.nm)


def test_rate_bound_is_the_steady_rate_of_a_homogeneous_pipeline():
    # Closed form: one VW, free links, many minibatches in flight: 1 / the slowest stage's compute.
    c = cluster([4], intra_Bps=1e18)
    p = profile(4, [0.01, 0.02, 0.01, 0.01], [0.02, 0.04, 0.02, 0.02])
    pl = plan([[f"node0/gpu{i}" for i in range(4)]], [0, 1, 2, 3, 4], nm=8, schedule="hetpipe")
    bound = rate_bound(plan_partitions(pl, c, p), nm=8)
    assert bound == pytest.approx(1 / 0.06)
    report = run_simulation(c, p, pl, SimOptions(waves=20, warmup_waves=4, trace=False))
    assert report.virtual_workers[0].minibatches_per_s == pytest.approx(bound, rel=0.01)


def test_rate_bound_with_one_minibatch_in_flight_is_the_round_trip():
    # Little's law: Nm = 1 leaves every stage idle but one; the rate is 1 / (sum of compute).
    c = cluster([3], intra_Bps=1e18)
    p = profile(3, [0.01, 0.02, 0.03], [0.02, 0.04, 0.06])
    pl = plan([[f"node0/gpu{i}" for i in range(3)]], [0, 1, 2, 3], nm=1, schedule="hetpipe")
    bound = rate_bound(plan_partitions(pl, c, p), nm=1)
    assert bound == pytest.approx(1 / 0.18)
    report = run_simulation(c, p, pl, SimOptions(waves=20, warmup_waves=4, trace=False))
    assert report.virtual_workers[0].minibatches_per_s == pytest.approx(bound, rel=0.01)


def test_default_search_is_deterministic_and_simulates_the_rows_it_marks():
    c, space = CASES["mixed fast/slow, NP/ED/HD, D 0 and 2"]
    runs = [search_plans(c, toy_model(), SearchSpace(waves=10, workers=1, **space)) for _ in range(2)]
    rows = [[(x.policy, x.nm, x.staleness, x.simulated_mb_s) for x in r.candidates] for r in runs]
    assert rows[0] == rows[1]
    simulated = [x for x in runs[0].candidates if x.simulated_mb_s is not None]
    assert len(simulated) == runs[0].simulated
    assert simulated[0].simulated_mb_s == pytest.approx(_simulate((c, toy_model(), simulated[0].plan,
                                                                    SearchSpace(waves=10, workers=1))).mb_s)
