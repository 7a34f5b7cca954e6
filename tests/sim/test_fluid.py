import math

import pytest
import simpy

from hetsim.sim.fluid import FluidShare, _Flow, _max_min_rates


def finish_times(capacity, flows):
    """Start (start_s, links, amount) flows; return each one's finish time."""
    env = simpy.Environment()
    share = FluidShare(env, capacity)
    done = {}

    def start(i, at, links, amount):
        yield env.timeout(at)
        yield share.transfer(links, amount)
        done[i] = env.now

    for i, (at, links, amount) in enumerate(flows):
        env.process(start(i, at, links, amount))
    env.run()
    return [done[i] for i in range(len(flows))]


def test_one_transfer_takes_bytes_over_bandwidth():
    assert finish_times({"l": 100.0}, [(0, ("l",), 50.0)]) == [0.5]


def test_two_concurrent_transfers_on_one_link_each_take_twice_as_long():
    alone = finish_times({"l": 100.0}, [(0, ("l",), 50.0)])[0]
    both = finish_times({"l": 100.0}, [(0, ("l",), 50.0), (0, ("l",), 50.0)])
    assert both == [2 * alone, 2 * alone]


def test_a_transfer_speeds_up_when_the_other_finishes():
    # 0..1: both at 50/s (A moves 50 of 100, B finishes its 50); 1..1.5: A alone at 100/s.
    assert finish_times({"l": 100.0}, [(0, ("l",), 100.0), (0, ("l",), 50.0)]) == [1.5, 1.0]


def test_transfers_on_opposite_directions_do_not_share():
    assert finish_times({"a:out": 100.0, "a:in": 100.0},
                        [(0, ("a:out",), 100.0), (0, ("a:in",), 100.0)]) == [1.0, 1.0]


def test_max_min_fair_rates_give_spare_capacity_to_unconstrained_flows():
    flows = [_Flow(0, ("a",), 1, math.inf, 0, None), _Flow(1, ("a", "b"), 1, math.inf, 0, None)]
    assert _max_min_rates(flows, {"a": 10.0, "b": 2.0}) == [8.0, 2.0]


def test_rate_cap_limits_a_flow_to_one_core():
    assert _max_min_rates([_Flow(0, ("cores",), 1, 1.0, 0, None)], {"cores": 2.0}) == [1.0]
    three = [_Flow(i, ("cores",), 1, 1.0, 0, None) for i in range(3)]
    assert _max_min_rates(three, {"cores": 2.0}) == [2 / 3] * 3


def test_carried_bytes_add_up_per_link():
    env = simpy.Environment()
    share = FluidShare(env, {"a": 10.0, "b": 10.0})
    share.transfer(("a", "b"), 30.0)
    share.transfer(("a",), 10.0)
    env.run()
    assert share.carried == {"a": 40.0, "b": 30.0}


def test_the_vectorised_filling_gives_the_same_rates():
    import random

    import numpy as np

    from hetsim.sim.fluid import _max_min_rates_numpy
    rng = random.Random(5)
    names = [f"l{i}" for i in range(40)]
    capacity = {name: rng.choice([1.0, 2.0, 5.0, 10.0]) for name in names}
    flows = []
    for i in range(300):
        links = tuple(rng.sample(names, rng.randint(1, 4)))
        flows.append(_Flow(i, links, 1, rng.choice([math.inf, 0.05, 0.2]), 0, None,
                           np.array([names.index(n) for n in links])))
    vectorised = _max_min_rates_numpy(flows, np.array([capacity[n] for n in names]))
    assert vectorised == pytest.approx(_max_min_rates(flows, capacity), rel=1e-9)
    assert all(r > 0 for r in vectorised)


def test_many_concurrent_transfers_finish_as_fair_sharing_predicts():
    # 200 equal transfers into one link (above the vectorised threshold) all end at 200 x alone.
    times = finish_times({"nic": 100.0, **{f"g{i}": 1000.0 for i in range(200)}},
                         [(0, (f"g{i}", "nic"), 10.0) for i in range(200)])
    assert times == pytest.approx([200 * 0.1] * 200, rel=1e-9)


def run_bounded(env, max_events=10_000):
    """env.run(), failing (rather than hanging) if the model keeps scheduling events."""
    for _ in range(max_events):
        if env.peek() == math.inf:
            return
        env.step()
    pytest.fail(f"still busy after {max_events} events at t={env.now}")


@pytest.mark.parametrize("start_s", [0.0, 1e7, 1e9, 1e12])
@pytest.mark.parametrize("amount, bandwidth", [(2.5e9, 1e9), (1e5, 1e10), (3.0, 7.0)])
def test_a_transfer_takes_bytes_over_bandwidth_at_any_clock_value(start_s, amount, bandwidth):
    # At 1e12 s the clock resolves ~1e-4 s: a 1e-5 s transfer ends at the same reading it started
    # (start + d rounds to start), and nothing re-predicts it forever.
    env = simpy.Environment(initial_time=start_s)
    share = FluidShare(env, {"l": bandwidth})
    done = share.transfer(("l",), amount)
    run_bounded(env)
    assert done.processed and env.now == start_s + amount / bandwidth
    assert share.carried == {"l": amount}


def test_a_transfer_starting_at_1e12_s_takes_exactly_bytes_over_bandwidth():
    env = simpy.Environment(initial_time=1e12)
    share = FluidShare(env, {"l": 1e9})
    share.transfer(("l",), 2.5e9)
    run_bounded(env)
    assert env.now - 1e12 == 2.5


def test_sharing_stays_exact_late_in_a_long_run():
    # The early-start test above, 1e12 s later: A 100 and B 50 at 100/s share until B ends at +1, then A
    # runs alone until +1.5 (durations that the clock at 1e12 s can represent exactly).
    assert finish_times({"l": 100.0}, [(1e12, ("l",), 100.0), (1e12, ("l",), 50.0)]) == [1e12 + 1.5, 1e12 + 1.0]


def test_many_short_transfers_late_in_a_run_finish_without_endless_re_predictions():
    env = simpy.Environment(initial_time=3e11)
    share = FluidShare(env, {"a": 1e10, "b": 3e9})
    events = [share.transfer(("a", "b") if i % 2 else ("a",), 1e3 * (i + 1)) for i in range(50)]
    run_bounded(env)
    assert all(e.processed for e in events)
    assert share.carried["a"] == sum(1e3 * (i + 1) for i in range(50))


# Rates of a running FluidShare (solved per component, remembered by kind) against a from-scratch
# progressive filling over every active flow, on random flow sets started and finished over time.

from hypothesis import given, settings
from hypothesis import strategies as st

from hetsim.sim import fluid as fluid_module

LINKS = ("a", "b", "c", "d", "e")
flow_sets = st.lists(
    st.tuples(st.integers(0, 3),                                   # start instant
              st.lists(st.sampled_from(LINKS), min_size=1, max_size=3, unique=True).map(tuple),
              st.sampled_from([1.0, 3.0, 10.0, 25.0]),             # amount
              st.sampled_from([math.inf, 2.0])),                   # cap
    min_size=1, max_size=24)


def started(flows, capacity):
    """An environment with each (at, links, amount, cap) flow's process started; `done[i]` is set to
    flow i's finish time as it finishes."""
    env = simpy.Environment()
    share = FluidShare(env, capacity)
    done = {}

    def start(i, at, links, amount, cap):
        yield env.timeout(at)
        yield share.transfer(links, amount, cap)
        done[i] = env.now

    for i, flow in enumerate(flows):
        env.process(start(i, *flow))
    return env, share, done


def rates_checked_against_scratch(flows, capacity):
    """Run `flows`; after every event with no start pending, compare each active flow's rate to a
    from-scratch solve of all active flows. Return each flow's finish time."""
    env, share, done = started(flows, capacity)
    while env.peek() < math.inf:
        env.step()
        active = list(share._flows.values())
        if active and not share._dirty:
            assert [f.rate for f in active] == pytest.approx(_max_min_rates(active, capacity), rel=1e-9)
    return [done[i] for i in range(len(flows))]


CAPACITY = {"a": 10.0, "b": 4.0, "c": 7.0, "d": 1.0, "e": 30.0}


@settings(max_examples=150, deadline=None)
@given(flow_sets)
def test_component_rates_equal_a_from_scratch_max_min_solve(flows):
    rates_checked_against_scratch(flows, CAPACITY)


@settings(max_examples=60, deadline=None)
@given(flow_sets)
def test_vectorised_rates_equal_a_from_scratch_max_min_solve(flows):
    original = fluid_module._VECTOR_FROM
    fluid_module._VECTOR_FROM = 3                 # the global vectorised solve from 3 active flows
    try:
        rates_checked_against_scratch(flows, CAPACITY)
    finally:
        fluid_module._VECTOR_FROM = original


def forgetful(monkeypatch):
    """Search and solve every time: the memos remember nothing."""
    monkeypatch.setattr(fluid_module._Memo, "get", lambda self, key: None)


@settings(max_examples=100, deadline=None)
@given(flow_sets)
def test_remembered_solves_give_bit_identical_finish_times(flows):
    remembered = finish_times_and_carried(flows)
    with pytest.MonkeyPatch.context() as monkeypatch:
        forgetful(monkeypatch)
        assert finish_times_and_carried(flows) == remembered


def finish_times_and_carried(flows):
    env, share, done = started(flows, CAPACITY)
    env.run()
    return [done[i] for i in range(len(flows))], share.carried


def test_a_repeated_set_of_concurrent_flows_is_solved_once():
    env = simpy.Environment()
    share = FluidShare(env, {"a": 10.0, "b": 5.0})
    calls = []
    solve = share._component_solver.solve
    share._component_solver.solve = lambda flows, key: calls.append(len(flows)) or solve(flows, key)

    def rounds():
        for _ in range(5):
            yield env.all_of([share.transfer(("a",), 20.0), share.transfer(("a", "b"), 10.0)])

    env.process(rounds())
    env.run()
    # A round: both at 5/s for 2 s (b holds a+b to 5), then a alone moves its last 10 at 10/s; the
    # first round solves {a, a+b}, {a} and the empty set left at its end, rounds 2-5 remember them.
    assert calls == [2, 1, 0]
    assert env.now == 5 * 3.0


def test_the_global_solve_from_kind_tables_is_bit_identical_to_the_per_flow_build():
    import random

    import numpy as np

    from hetsim.sim.fluid import _fill, _Kinds, _max_min_rates_numpy
    rng = random.Random(11)
    names = [f"l{i}" for i in range(30)]
    vector = np.array([rng.choice([1.0, 3.0, 7.0, 1e9 / 3]) for _ in names])
    kinds = _Kinds({name: i for i, name in enumerate(names)})
    flows = []
    for i in range(400):
        links = tuple(rng.sample(names, rng.randint(1, 5)))
        cap = rng.choice([math.inf, 0.05, 0.3])
        kind, columns = kinds.of(links, cap)
        flows.append(_Flow(i, links, 1, cap, 0, None, columns, kind))
        if i in (199, 399):                      # the kind table grows between solves
            assert (_fill(*kinds.incidence(tuple(f.kind for f in flows)), vector)
                    == _max_min_rates_numpy(flows, vector))


@settings(max_examples=60, deadline=None)
@given(flow_sets)
def test_dropping_outdated_predictions_at_once_gives_bit_identical_finish_times(flows):
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(fluid_module, "_STALE_FACTOR", 10**9)     # never compact
        kept = finish_times_and_carried(flows)
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(fluid_module, "_STALE_FACTOR", 0)         # compact at every re-arm
        monkeypatch.setattr(fluid_module, "_STALE_SLACK", 0)
        assert finish_times_and_carried(flows) == kept
