"""WSP's clock rule (hetsim.wsp_clock), the one the simulator, the executor and the schedule validator share."""

import pytest
from hypothesis import given, strategies as st

from hetsim.wsp_clock import WaveClocks, pull_needs


def test_pull_before_wave_w_needs_global_clock_w_minus_offset_minus_d():
    assert [pull_needs(w, staleness_bound=1, pull_offset=1) for w in range(5)] == [-2, -1, 0, 1, 2]
    assert pull_needs(7, staleness_bound=0, pull_offset=0) == 7


def test_a_clock_counts_complete_waves_in_order_only():
    clocks = WaveClocks([2, 1], staleness_bound=0, pull_offset=0)
    clocks.landed(0, 1)
    clocks.landed(0, 1)                      # wave 1 complete, wave 0 not yet: the clock waits
    assert clocks.c_local == [0, 0]
    clocks.landed(0, 0)
    assert clocks.c_local == [0, 0]          # one of two stages
    clocks.landed(0, 0)
    assert clocks.c_local == [2, 0]          # waves 0 and 1 at once
    assert clocks.c_global == 0
    clocks.landed(1, 0)
    assert (clocks.c_local, clocks.c_global) == ([2, 1], 1)


def test_waiters_are_released_in_arrival_order_once_the_global_clock_allows():
    clocks = WaveClocks([1, 1], staleness_bound=1, pull_offset=0)
    assert clocks.may_pull(1) and not clocks.may_pull(2)
    for waiter, wave in (("a", 3), ("b", 2), ("c", 2)):
        clocks.wait(wave, waiter)
    assert clocks.released() == []
    clocks.landed(0, 0)
    assert clocks.released() == []           # VW 1 still at clock 0
    clocks.landed(1, 0)
    assert clocks.released() == ["b", "c"] and clocks.waiting == ["a"]
    clocks.landed(0, 1), clocks.landed(1, 1)
    assert clocks.released() == ["a"] and clocks.waiting == []


def test_a_negative_bound_is_refused():
    with pytest.raises(ValueError, match="staleness bound -1"):
        WaveClocks([1], staleness_bound=-1, pull_offset=0)


@given(d=st.integers(0, 3), offset=st.integers(0, 2), order=st.randoms(use_true_random=False))
def test_no_pull_is_released_more_than_d_plus_offset_clocks_ahead_of_the_slowest(d, offset, order):
    """Two VWs of two stages push waves 0..5 in a random interleaving (each stage in wave order);
    every pull released must satisfy the bound at the moment of release."""
    clocks = WaveClocks([2, 2], staleness_bound=d, pull_offset=offset)
    pushes = {(v, s): list(range(6)) for v in range(2) for s in range(2)}
    for w in range(8):
        clocks.wait(w, w)
    released = clocks.released()
    while any(pushes.values()):
        v, s = order.choice(sorted(k for k, left in pushes.items() if left))
        clocks.landed(v, pushes[(v, s)].pop(0))
        now = clocks.released()
        assert all(w - offset - d <= clocks.c_global for w in now)
        released += now
    assert clocks.c_local == [6, 6]
    assert released == [w for w in range(8) if w - offset - d <= 6]      # and the rest still wait
    assert clocks.waiting == [w for w in range(8) if w - offset - d > 6]
