"""WSP through parameter-server ranks: the measured clock gap and staleness obey the simulator's bounds."""

from __future__ import annotations

import pytest

import executor
import hetsim
from exec_helpers import host, mlp_plan
from hetsim.plan import SyncSpec
from hetsim.profile import LayerProfile, ModelProfile

D = 1


@pytest.fixture(scope="module")
def wsp_run():
    """Two VWs, one emulated 4x slower, so the fast one runs into the staleness bound."""
    plan = mlp_plan([[0, 4, 9], [0, 5, 9]], nm=2, schedule="1f1b",
                    sync=SyncSpec(mode="wsp", staleness_bound=D), batch=16)
    cluster = host(4)
    opts = executor.ExecOptions(waves=7, warmup_waves=1, slowdown={"host/gpu2": 4.0, "host/gpu3": 4.0})
    return plan, cluster, executor.launch(plan, cluster, options=opts)


def nominal_profile(n_layers: int = 9) -> ModelProfile:
    layers = tuple(LayerProfile(name=f"l{i}", kind="Linear", param_bytes=1000, output_bytes=1000,
                                fwd_s={"cpu": 1e-3}, bwd_s={"cpu": 2e-3}) for i in range(n_layers))
    return ModelProfile(model="mlp", batch_size=16, layers=layers, input_bytes=1000,
                        edges=tuple((i, i + 1) for i in range(n_layers - 1)), source="nominal")


def test_measured_clock_gap_never_exceeds_d(wsp_run):
    plan, _, report = wsp_run
    assert report.sync["max_clock_gap"] <= D
    assert report.sync["parameter_server_ranks"] == 1


def test_the_bound_was_reached_and_the_fast_vw_waited(wsp_run):
    _, _, report = wsp_run
    assert report.sync["max_clock_gap"] == D       # the fast VW ran as far ahead as allowed ...
    assert report.sync["bound_wait_s"]["vw0"] > 0  # ... and was held there
    # As the simulator counts it, the hold excludes receiving the weights: the slowest VW, whose
    # own pushes advance the global clock, is held at most briefly.
    assert report.sync["bound_wait_s"]["vw1"] < 0.25 * report.sync["bound_wait_s"]["vw0"]


def test_global_staleness_within_simulator_bound(wsp_run):
    plan, cluster, report = wsp_run
    predicted = hetsim.simulate(cluster, nominal_profile(), plan, waves=7, warmup_waves=1)
    assert report.staleness["global_bound"] == predicted.staleness["global_bound"] == D + 1
    assert 0 <= report.staleness["global"]["max"] <= predicted.staleness["global_bound"]
    assert report.staleness["global"]["count"] == 7 * 4            # one push per wave per stage


def test_an_update_is_as_stale_as_the_weights_its_wave_ran_on(wsp_run):
    # 1F1B's first stage pulls wave w + 1 before it pushes wave w, so wave w ran on weights that lack
    # at least its own previous update; the record is that wave's pulled clock, as the simulator's is.
    _, _, report = wsp_run
    first = [row[4] for row in report.staleness_global if row[1] == 0 and row[2] >= 1]
    assert len(first) == 2 * 6 and min(first) >= 1


def test_every_update_has_a_staleness_record_and_loss(wsp_run):
    _, _, report = wsp_run
    assert report.staleness["local"]["count"] == 2 * 2 * 14
    assert len(report.training["losses"]) == 2 * 14
    assert any("emulated heterogeneity" in n for n in report.notes)
