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


@pytest.mark.parametrize("n", [2, 4])
def test_ranks_sharing_cores_move_bytes_with_those_cores(n):
    # Processes on one host: every transfer is two copies (sender, receiver) done by the shared
    # cores, so a step's n concurrent transfers split 2 cores; alone, one takes bytes / bandwidth.
    params, bandwidth, m, cores = 8_000_000, 1e9, 2, 2
    c = cluster([n], intra_Bps=bandwidth, shared_cores=cores)
    p = profile(1, 0.010, 0.020, param_bytes=params)
    pl = plan([[f"node0/gpu{i}"] for i in range(n)], [0, 1], nm=m, schedule="gpipe",
              sync=SyncSpec(mode="bsp"))
    report = run_simulation(c, p, pl, SimOptions(waves=10, trace=False))
    rate = bandwidth * min(2.0, cores / n) / 2                    # bytes/s of each transfer
    ring = 2 * (n - 1) * (params / n) / rate
    period = m * 0.030 * max(1.0, n / cores) + ring
    assert report.throughput["minibatches_per_s"] == pytest.approx(n * m / period, rel=1e-6)


@pytest.mark.parametrize("factor", [1.0, 1.25])
def test_colocated_work_scales_compute_of_ranks_sharing_cores(factor):
    # Four stages on two cores, no transfers: the cores are the bottleneck, so a minibatch takes all
    # four stages' work, times the co-location factor, over two cores. GPU nodes ignore the factor.
    p = profile(4, 0.010, 0.020)
    pl = plan([[f"node0/gpu{i}" for i in range(4)]], [0, 1, 2, 3, 4], nm=4, schedule="1f1b")
    shared = run_simulation(cluster([4], shared_cores=2, colocated_work=factor), p, pl,
                            SimOptions(waves=40, warmup_waves=10, trace=False))
    assert shared.throughput["minibatches_per_s"] == pytest.approx(2 / (4 * 0.030 * factor), rel=0.02)
    assert any("x1.250 its profiled" in n for n in shared.notes) == (factor != 1.0)


def test_one_transfer_alone_on_shared_cores_takes_bytes_over_bandwidth():
    # One minibatch at a time through two stages: activations and gradients never overlap, and with
    # ample cores each copy runs at the link's bandwidth, so sharing cores changes nothing.
    bandwidth = 1e9
    shared = cluster([2], intra_Bps=bandwidth, shared_cores=4)
    alone = cluster([2], intra_Bps=bandwidth)
    p = profile(2, 0.010, 0.020, out_bytes=8_000_000)
    pl = plan([["node0/gpu0", "node0/gpu1"]], [0, 1, 2], nm=1, schedule="gpipe")
    a, b = (run_simulation(c, p, pl, SimOptions(waves=10, trace=False)) for c in (shared, alone))
    assert a.throughput["minibatches_per_s"] == pytest.approx(b.throughput["minibatches_per_s"], rel=1e-9)
    assert b.throughput["minibatches_per_s"] == pytest.approx(1 / (0.060 + 2 * 0.008), rel=1e-6)


@pytest.mark.parametrize("m", [1, 4])
def test_a_rank_sharing_cores_is_busy_while_it_sends(m):
    # gloo writes a message on the sending rank's thread (World.send), so with ample cores a GPipe
    # wave is stage 0's m forwards each followed by its send, stage 1's last forward, stage 1's m
    # backwards each followed by its send, and stage 0's last backward.
    bandwidth, f, b, nbytes = 1e9, 0.010, 0.020, 8_000_000
    c = nbytes / bandwidth
    p = profile(2, f, b, out_bytes=nbytes)
    pl = plan([["node0/gpu0", "node0/gpu1"]], [0, 1, 2], nm=m, schedule="gpipe")
    report = run_simulation(cluster([2], intra_Bps=bandwidth, shared_cores=4), p, pl,
                            SimOptions(waves=10, trace=False))
    wave = m * (f + c) + f + m * (b + c) + b
    assert report.throughput["minibatches_per_s"] == pytest.approx(m / wave, rel=1e-6)


def test_a_process_moves_its_bytes_on_one_thread():
    # Two ranks exchanging in a ring step: each rank's one communication thread sends and receives,
    # so with ample cores a two-rank all-reduce takes twice what full-duplex links would give.
    params, bandwidth, n = 8_000_000, 1e9, 2
    p = profile(1, 0.010, 0.020, param_bytes=params)
    pl = plan([["node0/gpu0"], ["node0/gpu1"]], [0, 1], nm=1, schedule="gpipe", sync=SyncSpec(mode="bsp"))
    report = run_simulation(cluster([n], intra_Bps=bandwidth, shared_cores=8), p, pl,
                            SimOptions(waves=10, trace=False))
    ring = 2 * (n - 1) * (params / n) / (bandwidth / 2)
    assert report.throughput["minibatches_per_s"] == pytest.approx(n / (0.030 + ring), rel=1e-6)


def test_every_span_in_the_trace_names_its_gpu_and_each_gpu_times_its_allreduce():
    # Readers of trace.json (the Sailor check's gradient-reduction column) find a span's GPU in its
    # args, not by parsing the row's display name.
    c = cluster([2])
    p = profile(1, 0.010, 0.020, param_bytes=8_000_000)
    pl = plan([["node0/gpu0"], ["node0/gpu1"]], [0, 1], nm=2, schedule="gpipe", sync=SyncSpec(mode="bsp"))
    report = run_simulation(c, p, pl, SimOptions(waves=4, trace=True))
    spans = [e for e in report.trace.events if e["ph"] == "X"]
    assert spans and {e["args"]["gpu"] for e in spans} == {"node0/gpu0", "node0/gpu1"}
    reducing = {e["args"]["gpu"] for e in spans if e["name"].startswith("allreduce")}
    assert reducing == {"node0/gpu0", "node0/gpu1"}
