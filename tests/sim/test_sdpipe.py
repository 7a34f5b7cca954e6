import pytest

from conftest import cluster, plan, profile
from hetsim.plan import SyncSpec
from hetsim.sim import SimOptions, run_simulation


def setup(period: int, n: int = 4):
    c = cluster([n, n], intra_Bps=1e10, net_Bps=1e9)
    p = profile(2, 0.010, 0.020, param_bytes=1_000_000)
    vws = [[f"node0/gpu{v}", f"node1/gpu{v}"] for v in range(n)]
    return c, p, plan(vws, [0, 1, 2], nm=2, sync=SyncSpec(mode="sdpipe", sdpipe_period=period))


def test_period_one_is_plain_allreduce_every_group_holds_everyone():
    c, p, pl = setup(period=1)
    report = run_simulation(c, p, pl, SimOptions(waves=12, trace=False, jitter_cv=0.3))
    assert report.sync["group_size"]["histogram"] == {"4": 2 * 12}


STRAGGLER = {"node0/gpu3": 1.5, "node1/gpu3": 1.5}


def test_fast_pipelines_do_not_wait_for_a_straggler_unlike_allreduce():
    rates = {}
    for period in (1, 5):
        c, p, pl = setup(period)
        report = run_simulation(c, p, pl, SimOptions(waves=40, trace=False, slowdown=STRAGGLER))
        rates[period] = [v.minibatches_per_s for v in report.virtual_workers]
    assert max(rates[1]) == pytest.approx(min(rates[1]), rel=0.02)     # P = 1: lockstep
    assert min(rates[5][:3]) > 1.2 * rates[5][3]                         # P = 5: they move on


def test_groups_connect_every_pipeline_at_least_once_per_period():
    c, p, pl = setup(period=5)
    report = run_simulation(c, p, pl, SimOptions(waves=40, trace=False, slowdown=STRAGGLER))
    sizes = {int(k) for k in report.sync["group_size"]["histogram"]}
    assert min(sizes) < 4                               # groups formed without the straggler ...
    fastest_waves = 40
    for connections in report.sync["connections"]:      # ... yet all were linked every period
        assert connections >= fastest_waves // 5 - 1


def test_straggler_injection_is_seeded():
    c, p, pl = setup(period=3)
    opts = dict(waves=10, trace=False, straggler_prob=0.2, straggler_delay_s=0.05)
    a = run_simulation(c, p, pl, SimOptions(seed=1, **opts)).to_json()
    b = run_simulation(c, p, pl, SimOptions(seed=1, **opts)).to_json()
    assert a == b


def test_a_group_costs_its_messages_the_ring_and_each_members_passes_over_the_weights():
    # Two one-stage pipelines on one node, P = 1: every wave both join at once, so no window is open.
    # Per wave: compute 0.03 s; ring of 1 GB between two members at 10 GB/s, 2 steps of 0.5 GB = 0.1 s;
    # flattening (1 pass) and reducing, dividing, gathering (1.5 passes) at 1 TB/s = 2.5 ms;
    # join and reply messages of a few bytes: nanoseconds.
    from hetsim.sim.sdpipe import averaging_passes
    assert averaging_passes(1) == 0.0 and averaging_passes(2) == 2.5 and averaging_passes(4) == 1 + 7 / 4
    c = cluster([2], intra_Bps=1e10)
    p = profile(1, 0.010, 0.020, param_bytes=10**9)
    pl = plan([["node0/gpu0"], ["node0/gpu1"]], [0, 1], nm=1, sync=SyncSpec(mode="sdpipe", sdpipe_period=1))
    report = run_simulation(c, p, pl, SimOptions(waves=10, trace=False))
    for v in report.virtual_workers:
        assert v.minibatches_per_s == pytest.approx(1 / (0.03 + 0.1 + 0.0025), rel=1e-4)

