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
