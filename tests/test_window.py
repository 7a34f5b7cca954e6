"""The steady-state window: periodic completions timed exactly, a run's tail left out."""

import pytest

from hetsim.window import steady_window, window_closes, window_opens


def test_bursty_completions_at_different_phases_are_timed_exactly():
    # Two VWs complete two minibatches per 1 s wave (Nm = 2), in bursts, 0.3 s apart in phase.
    a = [k + d for k in range(1, 11) for d in (0.0, 0.1)]
    b = [t + 0.3 for t in a]
    w = steady_window([a, b], warmup=4, period=2)
    assert (w.start, w.end) == (pytest.approx(2.4), pytest.approx(10.1))
    assert w.rate(0) == pytest.approx(2.0) and w.rate(1) == pytest.approx(2.0)


def test_the_tail_after_the_first_vw_finishes_is_left_out():
    # vw1 runs at 1/s while vw0 runs, then at 4/s alone once vw0 has finished at t = 10.
    vw0 = [float(t) for t in range(1, 11)]
    vw1 = [float(t) for t in range(1, 11)] + [10 + 0.25 * k for k in range(1, 9)]
    w = steady_window([vw0, vw1], warmup=2)
    assert w.end == 10.0
    assert w.rate(1) == pytest.approx(1.0)            # over its whole run after warm-up: 1.6/s
    assert w.minibatches(0) == 8


def test_no_window_without_a_completion_after_warm_up():
    assert steady_window([[1.0, 2.0], [1.0]], warmup=1) is None
    assert steady_window([[1.0, 2.0], [5.0, 6.0]], warmup=1) is None    # vw0 done before vw1 warms


def test_a_vw_with_nothing_inside_the_window_is_timed_over_its_whole_run():
    w = steady_window([[1.0, 2.0, 3.0, 4.0], [1.5, 5.0, 6.0]], warmup=1)
    assert w.end == 4.0
    assert w.spans[1] == (1.5, 6.0, 2)
    assert w.whole_run == (1,)          # and the window says so (a report note: not a steady state)


def test_a_vw_that_waited_for_a_late_one_is_not_timed_over_the_wait():
    # vw0 warms up by t = 2, then (held by the staleness bound) waits for vw1, which starts late and
    # finishes warming up at t = 5; from then on both complete one minibatch a second.
    vw0 = [1.0, 2.0] + [float(t) for t in range(5, 15)]
    vw1 = [4.0, 5.0] + [float(t) for t in range(6, 16)]
    w = steady_window([vw0, vw1], warmup=2)
    assert w.start == 5.0 and w.end == 14.0
    assert w.rate(0) == pytest.approx(1.0) and w.rate(1) == pytest.approx(1.0)   # from t = 2: 10/12


def test_a_locked_window_counts_every_vw_at_the_slowest_rate():
    # WSP: vw1 runs at 2/s against vw0's 1/s inside the window; in the long run D holds it to 1/s.
    vw0 = [float(t) for t in range(1, 21)]
    vw1 = [0.5 * t for t in range(1, 41)]
    free = steady_window([vw0, vw1], warmup=2)
    locked = steady_window([vw0, vw1], warmup=2, locked=True)
    assert (free.rate(0), free.rate(1)) == (pytest.approx(1.0), pytest.approx(2.0))
    assert (locked.rate(0), locked.rate(1)) == (pytest.approx(1.0), pytest.approx(1.0))
    assert locked.free_rate(1) == free.rate(1)


def test_the_run_time_rules_open_and_close_the_window_at_the_instants_steady_window_finds():
    # Three VWs at different paces; replay their completions in time order as a run would see them.
    times = [[0.7 * k for k in range(1, 13)], [1.0 * k for k in range(1, 13)], [1.3 * k for k in range(1, 13)]]
    events = sorted((t, v) for v, ts in enumerate(times) for t in ts)
    completed, opened, closed = [0, 0, 0], None, None
    for t, v in events:
        completed[v] += 1
        if opened is None and window_opens(completed, 3):
            opened = t
        if closed is None and window_closes(completed, 12):
            closed = t
    w = steady_window(times, warmup=3)
    assert (opened, closed) == (w.start, w.end) == (pytest.approx(3.9), pytest.approx(8.4))


def test_a_final_drain_is_left_out_where_the_run_has_a_wave_to_spare():
    from hetsim.window import counted
    assert counted(40, 16, 8) == 32 and counted(24, 16, 8) == 24 and counted(24, 16, 0) == 24
    steady = [1.0 * k for k in range(1, 11)]                      # one a second...
    drained = steady + [10.2, 10.4]                               # ...then a drain of two at five a second
    w = steady_window([drained], warmup=2, period=2, drain=2)
    assert w.end == 10.0 and w.rate(0) == pytest.approx(1.0)
    assert steady_window([drained], warmup=2, period=2).rate(0) > 1.0


def test_a_run_too_short_for_a_whole_wave_in_its_window_says_its_rate_is_no_steady_state():
    import hetsim
    from hetsim.data import resolve
    from hetsim.cluster import load_cluster
    from hetsim.plan import load_plan
    args = (load_cluster(resolve("cluster", "hetpipe_4node")), hetsim.load_profile(resolve("profile", "vgg19_b32_analytic")),
            load_plan(resolve("plan", "hetpipe_vgg19_ed")))
    short = hetsim.simulate(*args, waves=3, warmup_waves=2, jitter_cv=0.02, trace=False)
    steady = hetsim.simulate(*args, waves=20, warmup_waves=2, jitter_cv=0.02, trace=False)
    assert any(n.startswith("window: ") and "not a steady-state rate" in n for n in short.notes)
    assert not any(n.startswith("window: ") for n in steady.notes)


def test_completions_that_repeat_in_pairs_are_timed_over_whole_pairs_not_just_whole_waves():
    # A HetPipe order with Nm = 3 can complete every 0.06 and 0.12 s in turn: over whole waves of 3
    # alone, the span would hold one gap of a kind more than the other.
    gaps = [0.06, 0.12] * 20
    times = [sum(gaps[:k + 1]) for k in range(len(gaps))]
    w = steady_window([times], warmup=3, period=3)
    assert w.rate(0) == pytest.approx(2 / 0.18, rel=1e-12)
    assert (w.spans[0][2] % 6) == 0


def test_completions_that_never_repeat_exactly_keep_whole_waves():
    times = [0.1 * k + (0.001 if k % 3 == 1 else 0.0) + 1e-6 * k * k for k in range(1, 40)]
    w = steady_window([times], warmup=3, period=3)
    assert w.spans[0][2] % 3 == 0
