import pytest

from conftest import cluster, plan, profile
from hetsim.plan import SyncSpec
from hetsim.sim import SimOptions, run_simulation


@pytest.mark.parametrize("n", [2, 4])
def test_bsp_wave_period_is_compute_plus_ring_allreduce(n):
    params, bandwidth, m = 8_000_000, 1e9, 2
    c = cluster([n], intra_Bps=bandwidth)
    p = profile(1, 0.010, 0.020, param_bytes=params)
    pl = plan([[f"node0/gpu{i}"] for i in range(n)], [0, 1], nm=m, schedule="gpipe",
              sync=SyncSpec(mode="bsp"))
    report = run_simulation(c, p, pl, SimOptions(waves=10, trace=False))
    ring = 2 * (n - 1) * (params / n) / bandwidth                # Horovod's ring, no contention
    period = m * 0.030 + ring
    assert report.throughput["minibatches_per_s"] == pytest.approx(n * m / period, rel=1e-6)


def test_bsp_makes_every_worker_wait_for_the_slowest():
    c = cluster([3])
    p = profile(1, 0.010, 0.020)
    pl = plan([[f"node0/gpu{i}"] for i in range(3)], [0, 1], nm=2, schedule="gpipe", sync=SyncSpec(mode="bsp"))
    report = run_simulation(c, p, pl, SimOptions(waves=10, trace=False, slowdown={"node0/gpu2": 2.0}))
    assert report.throughput["minibatches_per_s"] == pytest.approx(3 * 2 / (2 * 0.060), rel=1e-6)
