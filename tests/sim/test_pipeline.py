"""Closed forms a pipeline must reproduce before any measurement is worth comparing."""

import pytest

from conftest import cluster, plan, profile
from hetsim.plan import SyncSpec
from hetsim.sim import SimOptions, run_simulation

K = 4


def run(p, c, pl, **kw):
    return run_simulation(c, p, pl, SimOptions(trace=False, **kw))


@pytest.mark.parametrize("schedule", ["1f1b", "hetpipe"])
def test_homogeneous_pipeline_steady_throughput_is_one_over_the_slowest_stage(schedule):
    fwd = [0.010, 0.012, 0.008, 0.011]
    bwd = [0.020, 0.025, 0.019, 0.021]
    c = cluster([K], intra_Bps=2e9, latency_s=1e-5)
    p = profile(K, fwd, bwd, out_bytes=1_000_000)          # 0.5 ms per transfer: compute-bound
    report = run(p, c, plan([[f"node0/gpu{i}" for i in range(K)]], list(range(K + 1)), nm=K,
                            schedule=schedule), waves=30)
    expected = 1 / max(f + b for f, b in zip(fwd, bwd))
    assert report.throughput["minibatches_per_s"] == pytest.approx(expected, rel=0.01)


@pytest.mark.parametrize("waves", [4, 6, 12])
def test_a_short_run_of_a_schedule_that_never_flushes_counts_no_drain(waves):
    """The last wave of 1F1B drains the pipeline (the first stage only finishes backwards), faster than
    steady state; counted, it put these runs above 1 / the slowest stage. The window leaves it out."""
    fwd, bwd = [0.010, 0.012, 0.008, 0.011], [0.020, 0.025, 0.019, 0.021]
    c = cluster([K], intra_Bps=2e9, latency_s=1e-5)
    p = profile(K, fwd, bwd, out_bytes=1_000_000)
    report = run(p, c, plan([[f"node0/gpu{i}" for i in range(K)]], list(range(K + 1)), nm=K, schedule="1f1b"),
                 waves=waves, warmup_waves=2)
    assert report.throughput["minibatches_per_s"] == pytest.approx(1 / max(f + b for f, b in zip(fwd, bwd)),
                                                                   rel=1e-6)


def test_transfer_bound_pipeline_runs_at_the_link_rate():
    c = cluster([2], intra_Bps=1e8)
    p = profile(2, 0.001, 0.002, out_bytes=10_000_000)      # 0.1 s per activation transfer
    report = run(p, c, plan([["node0/gpu0", "node0/gpu1"]], [0, 1, 2], nm=4, schedule="hetpipe"), waves=20)
    assert report.throughput["minibatches_per_s"] == pytest.approx(10.0, rel=0.01)


def test_too_few_minibatches_in_flight_obey_littles_law():
    fwd, bwd = 0.010, 0.020
    c = cluster([K])
    p = profile(K, fwd, bwd)
    for nm in (1, 2, 3):
        report = run(p, c, plan([[f"node0/gpu{i}" for i in range(K)]], list(range(K + 1)), nm=nm,
                                schedule="hetpipe"), waves=40)
        roundtrip = K * (fwd + bwd)
        expected = min(nm / roundtrip, 1 / (fwd + bwd))
        assert report.throughput["minibatches_per_s"] == pytest.approx(expected, rel=0.01), nm


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b-flush"])
@pytest.mark.parametrize("m", [1, 4, 8])
def test_flush_schedules_have_the_gpipe_bubble_fraction(schedule, m):
    fwd, bwd = 0.010, 0.020
    c = cluster([K])
    p = profile(K, fwd, bwd)
    report = run(p, c, plan([[f"node0/gpu{i}" for i in range(K)]], list(range(K + 1)), nm=m,
                            schedule=schedule), waves=12)
    bubble = (K - 1) / (m + K - 1)
    for gpu in report.gpus:
        assert 1 - gpu.busy_fraction == pytest.approx(bubble, rel=1e-6)
    assert report.throughput["minibatches_per_s"] == pytest.approx(m / ((m + K - 1) * (fwd + bwd)), rel=1e-6)


def test_async_schedules_hold_one_weight_version_per_minibatch_in_flight():
    p = profile(K, 0.01, 0.02, param_bytes=1000, out_bytes=10)
    report = run(p, cluster([K]), plan([[f"node0/gpu{i}" for i in range(K)]], list(range(K + 1)), nm=K),
                 waves=4)
    stashed = [g.memory_breakdown["stash_bytes"] for g in report.gpus]
    assert stashed == [1000 * (K - 1 - s) for s in range(K)]     # PipeDream: k - s versions on stage s
    assert report.staleness["local"]["max"] == report.staleness["local_bound"] == K - 1


def test_slowdown_makes_that_stage_the_bottleneck():
    p = profile(2, 0.01, 0.02)
    pl = plan([["node0/gpu0", "node0/gpu1"]], [0, 1, 2], nm=2)
    report = run(p, cluster([2]), pl, waves=20, slowdown={"node0/gpu1": 2.0})
    assert report.throughput["minibatches_per_s"] == pytest.approx(1 / 0.06, rel=0.01)


def test_ranks_sharing_cores_slow_down_when_busy_ranks_exceed_cores():
    p = profile(4, 0.01, 0.02)
    vws = [[f"node0/gpu{i}" for i in range(4)]]
    alone = run(p, cluster([4]), plan(vws, [0, 1, 2, 3, 4], nm=4), waves=20)
    shared = run(p, cluster([4], shared_cores=2), plan(vws, [0, 1, 2, 3, 4], nm=4), waves=20)
    # Four busy ranks on two cores: half speed in steady state.
    assert shared.throughput["minibatches_per_s"] == pytest.approx(
        alone.throughput["minibatches_per_s"] / 2, rel=0.02)


def test_jitter_changes_results_only_through_the_seed():
    p = profile(2, 0.01, 0.02)
    pl = plan([["node0/gpu0", "node0/gpu1"]], [0, 1, 2], nm=2)
    a = run(p, cluster([2]), pl, waves=10, jitter_cv=0.2, seed=1)
    b = run(p, cluster([2]), pl, waves=10, jitter_cv=0.2, seed=1)
    c = run(p, cluster([2]), pl, waves=10, jitter_cv=0.2, seed=2)
    assert a.to_json() == b.to_json()
    assert a.throughput != c.throughput


@pytest.mark.parametrize("v", [2, 3])
@pytest.mark.parametrize("m", [4, 8])
def test_interleaved_1f1b_bubble_shrinks_by_the_chunk_count(v, m):
    """Megatron (SC'21 §2.2.2): with v chunks of equal time per device, an iteration takes
    m (F + B) + (p - 1)(F + B) / v, so the bubble fraction is (p - 1) / (v m + p - 1)."""
    fwd, bwd = 0.010, 0.020                  # one device's whole share; a chunk does 1/v of it
    c = cluster([K])
    p = profile(K * v, fwd / v, bwd / v)
    gpus = [f"node0/gpu{i}" for i in range(K)] * v
    report = run(p, c, plan([gpus], list(range(K * v + 1)), nm=m, schedule="1f1b-interleaved"), waves=8)
    bubble = (K - 1) / (v * m + K - 1)
    assert len(report.gpus) == K
    for gpu in report.gpus:
        assert 1 - gpu.busy_fraction == pytest.approx(bubble, rel=1e-6)
    iteration = m * (fwd + bwd) + (K - 1) * (fwd + bwd) / v
    assert report.throughput["minibatches_per_s"] == pytest.approx(m / iteration, rel=1e-6)


@pytest.mark.parametrize("m", [4, 8, 12])
def test_zb_h1_bubble_is_a_third_of_1f1b_with_equal_f_b_w(m):
    """Qi et al. (ICLR'24 §3.1): with F = B = W (backward = 2F, half of it the weight gradient), ZB-H1's
    iteration is m (F + B + W) + (p - 1)(F + B - W), 1F1B-flush's m (F + B + W) + (p - 1)(F + B + W)."""
    f = 0.010
    c = cluster([K])
    p = profile(K, f, 2 * f)
    gpus = [[f"node0/gpu{i}" for i in range(K)]]
    zb = run(p, c, plan(gpus, list(range(K + 1)), nm=m, schedule="zb-h1"), waves=8)
    flush = run(p, c, plan(gpus, list(range(K + 1)), nm=m, schedule="1f1b-flush"), waves=8)
    zb_bubble, flush_bubble = (K - 1) * (f + f - f), (K - 1) * 3 * f
    assert zb.throughput["minibatches_per_s"] == pytest.approx(m / (3 * f * m + zb_bubble), rel=1e-6)
    assert flush.throughput["minibatches_per_s"] == pytest.approx(m / (3 * f * m + flush_bubble), rel=1e-6)
    for gpu in zb.gpus:
        assert 1 - gpu.busy_fraction == pytest.approx(zb_bubble / (3 * f * m + zb_bubble), rel=1e-6)


def test_zb_h1_holds_the_same_peak_activations_as_1f1b():
    """ZB-H1 defers weight gradients but never holds more minibatches than 1F1B's first stage (p)."""
    p = profile(K, 0.01, 0.02, out_bytes=1000)
    gpus = [[f"node0/gpu{i}" for i in range(K)]]
    peak = {}
    for schedule in ("zb-h1", "1f1b-flush"):
        report = run(p, cluster([K]), plan(gpus, list(range(K + 1)), nm=8, schedule=schedule), waves=3)
        peak[schedule] = max(g.memory_breakdown["activation_bytes"] for g in report.gpus)
    assert peak["zb-h1"] == peak["1f1b-flush"] > 0


def test_an_interleaved_vw_waits_for_the_all_reduce_of_every_chunk_on_its_first_device():
    """The VW's sync wait is its first device's (as the executor measures rank 0's), every chunk's
    all-reduce included, not chunk 0's alone."""
    c = cluster([2, 2], net_Bps=1e8)
    p = profile(4, 0.01, 0.02, param_bytes=1_000_000)
    vws = [["node0/gpu0", "node0/gpu1"] * 2, ["node1/gpu0", "node1/gpu1"] * 2]
    report = run(p, c, plan(vws, [0, 1, 2, 3, 4], nm=2, schedule="1f1b-interleaved", sync=SyncSpec(mode="bsp")),
                 waves=6)
    first = {g.id: g.sync_wait_s for g in report.gpus}
    assert report.virtual_workers[0].sync_wait_s > 0.01
    assert report.virtual_workers[0].sync_wait_s == pytest.approx(first["node0/gpu0"], rel=1e-9)
    assert report.virtual_workers[1].sync_wait_s == pytest.approx(first["node1/gpu0"], rel=1e-9)


@pytest.mark.parametrize("m", [1, 4, 8])
def test_deepspeed_lockstep_pipeline_with_free_links_takes_1f1b_time(m):
    """DeepSpeed's TrainSchedule with instant transfers: (m + p - 1)(F + B) per iteration, as 1F1B."""
    fwd, bwd = 0.010, 0.020
    report = run(profile(K, fwd, bwd), cluster([K]), plan([[f"node0/gpu{i}" for i in range(K)]],
                                                          list(range(K + 1)), nm=m, schedule="1f1b-deepspeed"), waves=6)
    assert report.throughput["minibatches_per_s"] == pytest.approx(m / ((m + K - 1) * (fwd + bwd)), rel=1e-6)


@pytest.mark.parametrize("m", [1, 3, 8])
def test_deepspeed_two_stages_wait_out_each_transfer_in_turn(m):
    """Two stages, each transfer X long and a rendezvous: the first stage receives a gradient and then
    sends an activation, one after the other, every minibatch: (m + 1)(F + B) + 2 m X per iteration.
    Eager sends would hide the transfers behind the other stage's compute."""
    fwd, bwd, x = 0.010, 0.020, 0.004
    c = cluster([2], intra_Bps=1e8)
    p = profile(2, fwd, bwd, out_bytes=int(x * 1e8))
    report = run(p, c, plan([["node0/gpu0", "node0/gpu1"]], [0, 1, 2], nm=m, schedule="1f1b-deepspeed"), waves=6)
    iteration = (m + 1) * (fwd + bwd) + 2 * m * x
    assert report.throughput["minibatches_per_s"] == pytest.approx(m / iteration, rel=1e-6)


def test_deepspeed_middle_stages_add_four_transfers_per_minibatch():
    """From p = 3 on, a middle stage makes four transfers a minibatch (activation in and out, gradient
    in and out), so one more minibatch per wave adds F + B + 4X once the pipeline is full."""
    fwd, bwd, x = 0.010, 0.020, 0.004
    c = cluster([K], intra_Bps=1e8)
    p = profile(K, fwd, bwd, out_bytes=int(x * 1e8))
    gpus = [[f"node0/gpu{i}" for i in range(K)]]
    iteration = {m: m / run(p, c, plan(gpus, list(range(K + 1)), nm=m, schedule="1f1b-deepspeed"),
                            waves=6).throughput["minibatches_per_s"] for m in (8, 9)}
    assert iteration[9] - iteration[8] == pytest.approx(fwd + bwd + 4 * x, rel=1e-6)


def test_deepspeed_with_blocking_sends_costs_a_middle_stage_three_transfers_per_minibatch():
    """With `blocking_p2p` DeepSpeed's transfers are no rendezvous: a send holds its sender until
    delivered and a receiver waits only for the data. A middle stage's forward step sends the last
    gradient back (X), then waits for its activation, which the stage before sends only after taking
    that gradient (its backward step receives, then sends): X more. Its backward step finds the next
    gradient already there and sends the activation on (X). One more minibatch per wave adds
    F + B + 3X, against 4X for the rendezvous."""
    from dataclasses import replace
    fwd, bwd, x = 0.010, 0.020, 0.004
    c = cluster([K], intra_Bps=1e8)
    p = profile(K, fwd, bwd, out_bytes=int(x * 1e8))
    gpus = [[f"node0/gpu{i}" for i in range(K)]]
    iteration = {m: m / run(p, c, replace(plan(gpus, list(range(K + 1)), nm=m, schedule="1f1b-deepspeed"),
                                          blocking_p2p=True), waves=6).throughput["minibatches_per_s"]
                 for m in (8, 9)}
    assert iteration[9] - iteration[8] == pytest.approx(fwd + bwd + 3 * x, rel=1e-6)


def test_a_slowed_stage_under_hetpipe_is_checked_and_reported_with_the_minibatches_its_order_holds():
    # HetPipe's order is shaped by the stages' costs: slowing the last stage leaves the first one more
    # minibatches in flight, and the memory check, the reported memory and the local-staleness bound
    # must be those of the order the run follows, not of the unslowed one.
    from hetsim.feasibility import vw_schedule
    c = cluster([2])
    p = profile(2, [0.010, 0.010], [0.020, 0.020], out_bytes=1_000_000)
    pl = plan([["node0/gpu0", "node0/gpu1"]], [0, 1, 2], nm=6, schedule="hetpipe")
    slow = {"node0/gpu1": 1.5}
    held = vw_schedule(pl, pl.virtual_workers[0], c, p, 20, slowdown=slow).in_flight(0)
    assert held > vw_schedule(pl, pl.virtual_workers[0], c, p, 20).in_flight(0)
    report = run_simulation(c, p, pl, SimOptions(waves=20, trace=False, slowdown=slow))
    first = report.gpus[0]
    assert first.memory_breakdown["activation_bytes"] == held * 2 * 1_000_000     # its input and its output
    assert report.staleness["local_bound"] == held - 1 >= report.staleness["local"]["max"]


@pytest.mark.parametrize("waves", [6, 10, 20])
def test_hetpipe_whose_completions_repeat_every_two_of_nm_three_runs_at_its_bottleneck(waves):
    # The third stage takes 0.09 s a minibatch, the others 0.03: nothing can beat 1 / 0.09, and the
    # bottleneck is busy throughout; timed over whole waves of 3 alone, 6 waves read 3.8 % above it.
    c = cluster([4])
    p = profile(4, [0.01, 0.01, 0.03, 0.01], [0.02, 0.02, 0.06, 0.02])
    pl = plan([[f"node0/gpu{i}" for i in range(4)]], [0, 1, 2, 3, 4], nm=3, schedule="hetpipe")
    report = run_simulation(c, p, pl, SimOptions(waves=waves, trace=False))
    assert report.throughput["minibatches_per_s"] == pytest.approx(1 / 0.09, rel=1e-9)
