"""The report sections a prediction and a measurement share (hetsim.report_sections), by closed form."""

from dataclasses import replace

import pytest

import hetsim
from conftest import cluster, profile
from hetsim.plan import SyncSpec
from hetsim.planner.search import SearchSpace, search_plans
from hetsim.report_sections import RunRecords, run_sections, staleness_bounds
from hetsim.sim import SimOptions, run_simulation
from hetsim.window import SteadyWindow

PLAN = hetsim.load_plan("hetpipe_vgg19_ed")          # 4 VWs, Nm 4, minibatch 32, WSP with D = 0, hetpipe


def _run(**overrides) -> RunRecords:
    # VW v completes 8 minibatches in (v + 1) seconds: v + 1 ... 8 / (v + 1) minibatches per second.
    window = SteadyWindow(start=1.0, end=6.0, spans=tuple((1.0, 2.0 + v, 8) for v in range(4)))
    fields = dict(window=window, start_s=1.0, end_s=6.0, vw_sync_wait_s=[0.1, 0.2, 0.3, 0.4],
                  staleness_local=[(0, 0, 0, 0), (0, 0, 1, 2), (1, 3, 0, 1)],
                  staleness_global=[(0, 0, 1, 0, 1), (2, 1, 3, 1, 2)],
                  gates=[(0, 0, 2, 0.5, 1), (0, 1, 2, 0.25, 1), (1, 0, 3, 0.125, 0)], in_flight=4)
    return RunRecords(**{**fields, **overrides})


def test_throughput_is_the_sum_of_the_vws_rates_and_a_wave_is_nm_minibatches_per_vw():
    out = run_sections(PLAN, _run(tokens_per_sample=1024))
    rate = 8 / 1 + 8 / 2 + 8 / 3 + 8 / 4
    assert [v.minibatches_per_s for v in out["virtual_workers"]] == pytest.approx([8, 4, 8 / 3, 2])
    assert [v.sync_wait_s for v in out["virtual_workers"]] == [0.1, 0.2, 0.3, 0.4]
    t = out["throughput"]
    assert t["minibatches_per_s"] == pytest.approx(rate)
    assert t["samples_per_s"] == pytest.approx(32 * rate) and t["tokens_per_s"] == pytest.approx(32 * 1024 * rate)
    assert t["iteration_s"] == pytest.approx(4 * 4 / rate)
    assert out["window"] == {"start_s": 1.0, "end_s": 6.0, "duration_s": 5.0}


def test_a_locked_wsp_window_counts_every_vw_at_the_slowest_rate():
    run = _run()
    locked = replace(run, window=replace(run.window, locked=True))
    assert run_sections(PLAN, locked)["throughput"]["minibatches_per_s"] == pytest.approx(4 * 2)


def test_staleness_bounds_are_in_flight_minus_one_and_d_plus_pull_offset():
    s = run_sections(PLAN, _run())["staleness"]
    assert s["local"] == {"count": 3, "mean": 1.0, "max": 2, "histogram": {"0": 1, "1": 1, "2": 1}}
    assert s["local_bound"] == 3                       # hetpipe is asynchronous: in flight 4, minus 1
    assert s["global"]["max"] == 2 and s["global_bound"] == 0 + 1
    flushed = replace(PLAN, schedule="1f1b-flush", sync=SyncSpec(mode="bsp"))
    assert run_sections(flushed, _run())["staleness"] == {"local": s["local"], "local_bound": 0}


def test_wsp_sync_reports_the_clock_gap_and_the_first_stages_waits_per_vw():
    sync = run_sections(PLAN, _run(wsp_state={"parameter_server_ranks": 2}))["sync"]
    assert sync["mode"] == "wsp" and sync["parameter_server_ranks"] == 2
    assert (sync["staleness_bound"], sync["pull_offset"]) == (0, 1)
    assert sync["max_clock_gap"] == max((2 - 1) - 1, (3 - 1) - 0)
    assert sync["bound_wait_s"] == {"vw0": 0.5, "vw1": 0.125, "vw2": 0, "vw3": 0}


def test_sdpipe_sync_reports_its_groups():
    plan = replace(PLAN, schedule="1f1b", sync=SyncSpec(mode="sdpipe", sdpipe_period=5))
    sync = run_sections(plan, _run(sdpipe_group_sizes=[2, 3, 3], sdpipe_connections=7))["sync"]
    assert sync == {"mode": "sdpipe", "period": 5, "groups": 3, "connections": 7,
                    "group_size": {"count": 3, "mean": 8 / 3, "max": 3, "histogram": {"2": 1, "3": 2}}}


def test_the_planner_states_the_staleness_bounds_the_simulation_reports():
    # Nm = 16 on pipelines whose round trip holds fewer minibatches than that: the local bound is
    # in-flight - 1 = 12, not Nm - 1 = 15, in the plan table and in the simulated report alike.
    c = cluster([4, 4], intra_Bps=1e10, net_Bps=1e9, latency_s=1e-5)
    p = profile(4, 0.010, 0.020, out_bytes=100_000, param_bytes=2_000_000)
    result = search_plans(c, p, SearchSpace(policies=("ED",), nm_values=(16,), staleness_values=(2,),
                                            top_k=1, waves=6, workers=1))
    best = result.best
    report = run_simulation(c, p, best.plan, SimOptions(waves=20, trace=False))
    local, global_ = staleness_bounds(best.plan, best.in_flight)
    assert (local, global_) == (report.staleness["local_bound"], report.staleness["global_bound"])
    assert local == report.staleness["local"]["max"] < best.nm - 1
