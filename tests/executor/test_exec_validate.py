"""Pure parts of `hetsim validate`: comparison rows, the host cluster, plan mapping, profile folding."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from exec_helpers import mlp_plan
from executor.validate import bracketed, host_cluster, onto_host, with_optimizer_costs
from hetsim.compare import compare_reports, format_comparison, percent_error
from hetsim.plan import Plan, StageSpec, SyncSpec, VirtualWorker
from hetsim.profile import LayerProfile, ModelProfile
from hetsim.report import GpuStats, Report, VwStats


@pytest.mark.parametrize("pred,meas,want", [(105.0, 100.0, 5.0), (90.0, 100.0, -10.0), (1.0, 0.0, None),
                                            (None, 1.0, None)])
def test_percent_error_is_relative_to_the_measurement(pred, meas, want):
    assert percent_error(pred, meas) == want


def _report(kind: str, rate: float, compute_s: float) -> Report:
    gpu = GpuStats(id="host/gpu0", type="cpu", vw="vw0", stage=0, layers=(0, 3), busy_fraction=compute_s / 2,
                   compute_s=compute_s, recv_wait_s=0.0, sync_wait_s=0.0, memory_bytes=0, memory_capacity_bytes=1)
    return Report(kind=kind, plan={}, cluster="c", model="m", profile_source="", settings={},
                  window={"start_s": 0.0, "end_s": 2.0, "duration_s": 2.0},
                  throughput={"minibatches_per_s": rate, "samples_per_s": 10 * rate},
                  virtual_workers=[VwStats(name="vw0", minibatches=int(2 * rate), minibatches_per_s=rate,
                                           samples_per_s=10 * rate, sync_wait_s=0.0)],
                  gpus=[gpu], links=[], staleness={"local": {"max": 1, "mean": 0.5}}, sync={"mode": "none"})


def test_compare_reports_gives_throughput_and_per_minibatch_compute():
    rows = {r.metric: r for r in compare_reports(_report("prediction", 50.0, 1.0), _report("measurement", 40.0, 1.2))}
    assert rows["throughput samples/s"].error_pct == pytest.approx(25.0)
    compute = rows["host/gpu0 [vw0 s0] compute ms/minibatch"]
    assert compute.predicted == pytest.approx(10.0) and compute.measured == pytest.approx(15.0)
    assert rows["local staleness max"].error_pct == 0.0
    assert "+25.0%" in format_comparison(list(rows.values()))


def test_onto_host_renames_gpus_in_plan_order():
    plan = Plan(name="p", model="mlp", minibatch_size=8, nm=1, schedule="gpipe", sync=SyncSpec(mode="bsp"),
                virtual_workers=(VirtualWorker(name="a", stages=(StageSpec(gpu="n1/gpu3", layers=(0, 9)),)),
                                 VirtualWorker(name="b", stages=(StageSpec(gpu="n0/gpu0", layers=(0, 9)),))))
    mapped, names = onto_host(plan)
    assert names == {"n1/gpu3": "host/gpu0", "n0/gpu0": "host/gpu1"}
    assert mapped.gpus == ["host/gpu0", "host/gpu1"]


def test_host_cluster_shares_its_cores():
    cluster = host_cluster(3, 1.5, 2e9, 5e-5)
    assert [g.id for g in cluster.gpus] == ["host/gpu0", "host/gpu1", "host/gpu2"]
    assert cluster.nodes[0].shared_cores == 1.5
    assert cluster.nodes[0].colocated_work == 1.0
    assert host_cluster(2, 2, 2e9, 5e-5, 1.08).nodes[0].colocated_work == 1.08


def test_no_hand_off_delay_is_probed_unless_the_other_ranks_can_fill_the_cores(monkeypatch):
    import executor.calibrate as calibrate
    monkeypatch.setattr(calibrate, "wake_delays", lambda *a: pytest.fail("probed with a core per rank"))
    assert calibrate.handoff_delay(2, 2.0) == 0.0
    assert calibrate.handoff_delay(2, 1.99) == 0.0     # two ranks on a host measured at 1.99 cores
    assert calibrate.handoff_delay(3, 3.5) == 0.0


def test_the_hand_off_delay_is_the_loaded_one_way_delay_beyond_the_unloaded(monkeypatch):
    import executor.calibrate as calibrate
    seen = []

    def delays(spinners, rounds, compute_s):
        seen.append(spinners)
        return {2: [1e-4, 1e-4, 8.8e-3], 0: [1e-4, 3e-4]}[spinners]     # means 3 ms and 0.2 ms
    monkeypatch.setattr(calibrate, "wake_delays", delays)
    assert calibrate.handoff_delay(4, 1.99) == pytest.approx(2.8e-3)
    assert sorted(seen) == [0, 2]              # the other ranks spin: all but sender and receiver
    monkeypatch.setattr(calibrate, "wake_delays", lambda spinners, *a: [1e-4] if spinners else [2e-4])
    assert calibrate.handoff_delay(3, 2.0) == 0.0     # never a negative delay


def test_the_hand_off_probe_times_gloo_sends_to_a_blocked_receiver():
    import statistics

    from executor.calibrate import wake_delays
    # Real processes, no load: a wake-up takes about 0.1 ms here. Stamps paired a round apart would
    # read about the 5 ms of compute between hand-offs, or a negative time.
    delays = wake_delays(0, 6)
    assert len(delays) == 6 and 0 < statistics.median(delays) < 2e-3


def test_a_measured_latency_carries_the_hand_off_delay_and_a_given_one_is_taken_whole(monkeypatch):
    import executor.calibrate as calibrate
    from executor.validate import _host_now
    monkeypatch.setattr(calibrate, "link_speed", lambda **kw: (1e-4, 2e9))
    monkeypatch.setattr(calibrate, "handoff_delay", lambda ranks, cores: 2e-3 if ranks > cores else 0.0)
    three = mlp_plan([[0, 3, 6, 9]], nm=3, schedule="1f1b")
    cluster, handoff = _host_now(three, "mlp", None, {}, 2, None, None, 1.0, "cpu")
    assert handoff == 2e-3 and cluster.nodes[0].intra_link.latency_s == pytest.approx(2.1e-3)
    cluster, handoff = _host_now(three, "mlp", None, {}, 2, None, 5e-5, 1.0, "cpu")
    assert handoff == 0.0 and cluster.nodes[0].intra_link.latency_s == 5e-5
    cluster, handoff = _host_now(mlp_plan([[0, 4, 9]], nm=2, schedule="1f1b"), "mlp", None, {}, 2, None, None,
                                 1.0, "cpu")
    assert handoff == 0.0 and cluster.nodes[0].intra_link.latency_s == 1e-4


def test_colocation_factor_compares_the_stages_together_with_each_alone():
    from executor.colocation import colocation_factor
    assert colocation_factor("mlp", [(0, 5)], batch=8) == 1.0          # one process shares nothing
    with pytest.raises(ValueError, match="seconds must be > 0 and rounds >= 1"):
        colocation_factor("mlp", [(0, 2), (2, 5)], batch=8, seconds=0)
    # Two small stages on this host: the probe runs and gives CPU work together over alone, which a
    # broken probe (a stage doing nothing, work counted twice) would put far from 1.
    # A timed probe on a shared host: a burst of other load can push one reading out, so up to three
    # are taken; a broken probe is out of range every time.
    factors = []
    for _ in range(3):
        factors.append(colocation_factor("mlp", [(0, 4), (4, 9)], batch=32, model_kwargs={"hidden": 128, "depth": 4},
                                         slowdowns=[1.0, 1.5], seconds=0.2))
        if 0.7 < factors[-1] < 1.6:
            break
    assert 0.7 < factors[-1] < 1.6, factors


def test_optimizer_costs_are_added_to_each_layers_backward():
    layers = tuple(LayerProfile(name=f"l{i}", kind="Linear", param_bytes=4, output_bytes=4,
                                fwd_s={"cpu": 1.0}, bwd_s={"cpu": 2.0}) for i in range(2))
    profile = ModelProfile(model="m", batch_size=1, layers=layers, edges=((0, 1),), input_bytes=4)
    folded = with_optimizer_costs(profile, [0.5, 0.25])
    assert [l.bwd_s["cpu"] for l in folded.layers] == [2.5, 2.25]
    assert [l.fwd_s["cpu"] for l in folded.layers] == [1.0, 1.0]


def test_a_change_of_host_load_during_a_run_is_flagged():
    from executor.validate import load_changed
    steady = SimpleNamespace(training={"cores_available": {"before": 1.99, "after": 1.95}})
    loaded = SimpleNamespace(training={"cores_available": {"before": 1.99, "after": 1.2}})
    assert load_changed(steady) is None
    assert "1.99 before, 1.2 after" in load_changed(loaded)


def test_a_rank_whose_cpu_work_drifts_from_the_profile_beyond_the_max_error_target_is_flagged():
    from executor.validate import WORK_DRIFT_PCT, work_drift
    gpus = [SimpleNamespace(id=f"host/gpu{i}", vw="vw0", stage=i, tp=1) for i in range(2)]
    report = lambda measured, device="cpu", shared=None: SimpleNamespace(gpus=gpus, settings={"device": device}, training={
        "predicted_work_s_per_minibatch": {"host/gpu0": 0.100, "host/gpu1": 0.050},
        "compute_work_s_per_minibatch": {"host/gpu0": 0.100, "host/gpu1": measured},
        **({"gpu_concurrency": shared} if device != "cpu" else {})})
    assert WORK_DRIFT_PCT == 8.0
    assert work_drift(report(0.0535)) is None                 # 6.5%: within the target
    warning = work_drift(report(0.040))
    assert "1 rank(s)" in warning and "host/gpu1 [vw0 s1]" in warning and "more than 8%" in warning
    # On a GPU each the GPU time is compared; ranks sharing one GPU wait for each other's turns in it,
    # and a tensor-parallel member's passes hold its all-reduces.
    assert "host/gpu1 [vw0 s1]" in work_drift(report(0.040, "cuda"))
    assert work_drift(report(0.040, "cuda", shared=1.5)) is None
    gpus[1].tp = 2
    assert work_drift(report(0.040, "cuda")) is None and "host/gpu1" in work_drift(report(0.040))


def test_default_warmup_leaves_a_window_for_short_runs():
    from executor.validate import WARMUP_WAVES, default_warmup
    assert default_warmup(30) == WARMUP_WAVES == 12
    assert default_warmup(10) == 4            # `hetsim validate --waves 10` alone still measures 6 waves
    assert all(0 <= default_warmup(w) < w for w in range(1, 60))


def _two_layers(fwd: list[float], bwd: list[float]) -> ModelProfile:
    layers = tuple(LayerProfile(name=f"l{i}", kind="Linear", param_bytes=4, output_bytes=4,
                                fwd_s={"cpu": fwd[i]}, bwd_s={"cpu": bwd[i]}) for i in range(2))
    return ModelProfile(model="m", batch_size=1, layers=layers, edges=((0, 1),), input_bytes=4)


def _two_stage_plan(schedule: str) -> Plan:
    return Plan(name="p", model="m", minibatch_size=1, nm=3, schedule=schedule, sync=SyncSpec(),
                virtual_workers=(VirtualWorker(name="vw0", stages=(StageSpec(gpu="host/gpu0", layers=(0, 1)),
                                                                   StageSpec(gpu="host/gpu1", layers=(1, 2)))),))


def test_the_prediction_uses_the_mean_of_the_profiles_around_the_run():
    from executor.validate import bracketed
    before, after = _two_layers([1.0, 2.0], [2.0, 4.0]), _two_layers([1.2, 2.2], [2.4, 4.0])
    mean = bracketed(before, after, _two_stage_plan("1f1b"), host_cluster(2, 2, 1e9, 0.0), waves=4)
    assert [l.fwd_s["cpu"] for l in mean.layers] == pytest.approx([1.1, 2.1])
    assert [l.bwd_s["cpu"] for l in mean.layers] == pytest.approx([2.2, 4.0])


def test_a_mean_profile_that_would_reorder_a_hetpipe_schedule_is_not_used():
    # The executor replayed the hetpipe order `before` gives; a mean whose order differs would make
    # the prediction replay another schedule, so it keeps `before`. A uniform drift keeps the order.
    from executor.validate import bracketed
    from hetsim.feasibility import vw_schedule
    plan, cluster = _two_stage_plan("hetpipe"), host_cluster(2, 2, 1e9, 0.0)
    order = lambda p: vw_schedule(plan, plan.virtual_workers[0], cluster, p, 4).stages
    before = _two_layers([1.0, 0.5], [2.0, 1.0])
    reordering = _two_layers([0.1, 0.5], [0.2, 1.0])
    assert order(reordering) != order(before)
    assert bracketed(before, reordering, plan, cluster, waves=4) is before
    drifted = bracketed(before, _two_layers([1.1, 0.55], [2.2, 1.1]), plan, cluster, waves=4)
    assert drifted is not before and drifted.layers[0].fwd_s["cpu"] == pytest.approx(1.05)


def test_the_executor_orders_a_hetpipe_schedule_by_the_emulated_slowdown_as_the_simulator_does():
    # A rank emulated 2x slow costs its stage twice the profile's time in the run: the executor orders
    # its hetpipe schedule by those costs, as the prediction of that run does (hetsim.simulate).
    from executor import ExecOptions
    from executor.worker import Job
    from hetsim.feasibility import vw_schedule
    plan, cluster, before = _two_stage_plan("hetpipe"), host_cluster(2, 2, 1e9, 0.0), _two_layers([1.0, 0.5], [2.0, 1.0])
    slow = {"host/gpu1": 2.0}
    order = lambda s: vw_schedule(plan, plan.virtual_workers[0], cluster, before, 4, slowdown=s)
    assert order(slow) != order(None)
    job = lambda s: Job(plan=plan, cluster=cluster, model="m", options=ExecOptions(waves=4, slowdown=s), profile=before)
    assert job(slow).schedules() == [order(slow)] and job({}).schedules() == [order(None)]
    # The mean profile is kept only where it orders the slowed run as `before` did.
    after = _two_layers([1.2, 0.5], [2.4, 1.0])
    assert bracketed(before, after, plan, cluster, waves=4) is not before
    assert bracketed(before, after, plan, cluster, waves=4, slowdown=slow) is before


def test_the_work_each_rank_measured_becomes_per_rank_slowdowns_for_the_simulators_share_of_the_error():
    from executor.validate import measured_work_slowdown
    gpus = [SimpleNamespace(id=f"host/gpu{i}", vw="vw0", stage=i, tp=1) for i in range(2)]
    report = lambda device="cpu", shared=None: SimpleNamespace(gpus=gpus, settings={"device": device}, training={
        "predicted_work_s_per_minibatch": {"host/gpu0": 0.100, "host/gpu1": 0.050},
        "compute_work_s_per_minibatch": {"host/gpu0": 0.120, "host/gpu1": 0.040},
        **({"gpu_concurrency": shared} if device != "cpu" else {})})
    # Measured over profiled work, times the rank's emulated slowdown (its measured work leaves the
    # emulation out, as the profile does).
    assert measured_work_slowdown(report(), {"host/gpu1": 2.0}) == pytest.approx({"host/gpu0": 1.2, "host/gpu1": 1.6})
    assert measured_work_slowdown(report(), None) == pytest.approx({"host/gpu0": 1.2, "host/gpu1": 0.8})
    # Not where some rank's work is not compared: ranks sharing a GPU, or a tensor-parallel member on
    # CUDA, whose passes' GPU time holds its all-reduces. On CPU a member's thread CPU seconds do not.
    assert measured_work_slowdown(report("cuda", shared=1.5), None) is None
    gpus[1].tp = 2
    assert measured_work_slowdown(report("cuda"), None) is None
    assert measured_work_slowdown(report(), None) == pytest.approx({"host/gpu0": 1.2, "host/gpu1": 0.8})


def _tp_hetpipe_plan() -> Plan:
    """Stage 0 on gpu0; stage 1 tensor-parallel over gpu1 (lead) and gpu2."""
    return Plan(name="p", model="m", minibatch_size=1, nm=3, schedule="hetpipe", sync=SyncSpec(),
                virtual_workers=(VirtualWorker(name="vw0", stages=(
                    StageSpec(gpu="host/gpu0", layers=(0, 1)),
                    StageSpec(gpu="host/gpu1", tp_gpus=("host/gpu2",), layers=(1, 2)))),))


def test_a_tensor_parallel_stage_orders_a_hetpipe_schedule_at_its_slowest_members_pace():
    # The group computes in lockstep, so a slow non-lead member slows the stage as a slow lead does.
    from hetsim.feasibility import vw_schedule
    plan, cluster, profile = _tp_hetpipe_plan(), host_cluster(3, 3, 1e9, 0.0), _two_layers([1.0, 1.0], [2.0, 2.0])
    order = lambda s: vw_schedule(plan, plan.virtual_workers[0], cluster, profile, 4, slowdown=s).stages
    assert order({"host/gpu1": 4.0}) != order(None)
    assert order({"host/gpu2": 4.0}) == order({"host/gpu1": 4.0})


def test_a_tensor_parallel_members_predicted_work_is_what_the_simulator_charges_it():
    # Its share of the stage: the profile's times at its TP degree where it has them, else over t.
    from executor.validate import _annotate
    plan = _tp_hetpipe_plan()
    measurement = SimpleNamespace(gpus=[], settings={"device": "cpu"}, training={"compute_work_s_per_minibatch": {}})
    profile = _two_layers([1.0, 0.4], [2.0, 0.8])
    _annotate(measurement.training, plan, host_cluster(3, 3, 1e9, 0.0), profile, measurement, "cpu")
    assert measurement.training["predicted_work_s_per_minibatch"] == pytest.approx(
        {"host/gpu0": 3.0, "host/gpu1": 0.6, "host/gpu2": 0.6})
    at_tp2 = lambda l, f, b: replace(l, fwd_s={**l.fwd_s, "cpu@tp2": f}, bwd_s={**l.bwd_s, "cpu@tp2": b})
    timed = replace(profile, layers=(at_tp2(profile.layers[0], 0.6, 1.2), at_tp2(profile.layers[1], 0.3, 0.5)))
    _annotate(measurement.training, plan, host_cluster(3, 3, 1e9, 0.0), timed, measurement, "cpu")
    assert measurement.training["predicted_work_s_per_minibatch"]["host/gpu2"] == pytest.approx(0.8)


def test_the_prediction_at_measured_work_is_left_out_where_it_would_reorder_a_hetpipe_schedule():
    from executor.validate import _orders_agree
    plan, cluster, before = _two_stage_plan("hetpipe"), host_cluster(2, 2, 1e9, 0.0), _two_layers([1.0, 0.5], [2.0, 1.0])
    assert _orders_agree(plan, cluster, before, 4, {}, {"host/gpu0": 1.1, "host/gpu1": 1.1})
    assert not _orders_agree(plan, cluster, before, 4, {}, {"host/gpu1": 2.0})
    assert _orders_agree(_two_stage_plan("1f1b"), cluster, before, 4, {}, {"host/gpu1": 2.0})   # no cost order


def test_a_ranks_predicted_work_adds_up_every_chunk_it_holds():
    # Interleaved 1F1B: stages 0 and 2 on gpu0, 1 and 3 on gpu1; the rank's work is both chunks'.
    from executor.validate import _annotate
    layers = tuple(LayerProfile(name=f"l{i}", kind="Linear", param_bytes=4, output_bytes=4,
                                fwd_s={"cpu": 0.001 * (i + 1)}, bwd_s={"cpu": 0.002 * (i + 1)}) for i in range(4))
    profile = ModelProfile(model="m", batch_size=1, layers=layers, edges=((0, 1), (1, 2), (2, 3)), input_bytes=4)
    plan = Plan(name="p", model="m", minibatch_size=1, nm=4, schedule="1f1b-interleaved", sync=SyncSpec(),
                virtual_workers=(VirtualWorker(name="vw0", stages=tuple(
                    StageSpec(gpu=f"host/gpu{j % 2}", layers=(j, j + 1)) for j in range(4))),))
    training = {"compute_work_s_per_minibatch": {"host/gpu0": 0.012, "host/gpu1": 0.018}}
    measurement = SimpleNamespace(gpus=[SimpleNamespace(id=f"host/gpu{i}", vw="vw0", stage=i, tp=1) for i in range(2)],
                                  settings={"device": "cpu"}, training=training)
    _annotate(training, plan, host_cluster(2, 2, 1e9, 0.0, colocated_work=1.5), profile, measurement, "cpu")
    assert training["predicted_work_s_per_minibatch"] == pytest.approx({"host/gpu0": 1.5 * 0.012, "host/gpu1": 1.5 * 0.018})
    assert training["cpu_work_drift"]["max_abs_error_pct"] == pytest.approx(50.0)     # each measured 1/1.5 of it
    # Processes with a GPU each do not share cores: the simulator charges no co-located factor then.
    _annotate(training, plan, host_cluster(2, None, 1e9, 0.0, colocated_work=1.5), profile, measurement, "cuda")
    assert training["predicted_work_s_per_minibatch"] == pytest.approx({"host/gpu0": 0.012, "host/gpu1": 0.018})


def test_validate_plan_predicts_from_profiles_on_both_sides_of_the_run(tmp_path, capsys, monkeypatch):
    import json
    import shlex

    from executor.validate import validate_plan, write_inputs
    from hetsim.cli import main
    plan = mlp_plan([[0, 9]], nm=2, schedule="1f1b")
    inputs: dict = {}
    prediction, measurement = validate_plan(plan, waves=6, warmup_waves=2, cores=2, link_Bps=2e9,
                                            latency_s=5e-5, colocated_work=1.0, profile_repeats=2, inputs=inputs)
    # The files written from `inputs` predict the same again, bit for bit, through `hetsim simulate`
    # run in their folder, wherever it has moved.
    write_inputs(inputs, str(tmp_path / "inputs"))
    (tmp_path / "inputs").rename(tmp_path / "moved")
    monkeypatch.chdir(tmp_path / "moved")
    command = (tmp_path / "moved" / "command.txt").read_text().splitlines()[-1]
    capsys.readouterr()
    assert main(shlex.split(command)[1:] + ["--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["throughput"] == prediction.throughput
    assert prediction.kind == "prediction" and measurement.kind == "measurement"
    assert prediction.profile_source.endswith("mean of profiles before and after the run")
    work = measurement.training["predicted_work_s_per_minibatch"]
    assert sorted(work) == ["host/gpu0"]
    assert measurement.training["cpu_work_drift"]["tolerance_pct"] == 8.0
    # One stage with a core to itself: the prediction is one minibatch per profiled work (forward,
    # backward and optimiser step of the profile the prediction used), exactly.
    assert prediction.throughput["minibatches_per_s"] == pytest.approx(1 / work["host/gpu0"], rel=1e-9)
    # A single-threaded rank cannot finish minibatches faster than its thread does their CPU work.
    cpu = measurement.training["compute_work_s_per_minibatch"]["host/gpu0"]
    assert 0 < measurement.throughput["minibatches_per_s"] * cpu <= 1
    # At the work the rank measured, the same closed form: one minibatch per measured work.
    replayed = measurement.training["predicted_samples_s_at_measured_work"]
    assert replayed == pytest.approx(plan.minibatch_size / cpu, rel=1e-9)
    # ... and with its passes varying as they did in the run: mean-one jitter, about the same rate.
    cv = measurement.training["compute_work_cv"]["host/gpu0"]
    assert cv > 0 and measurement.training["work_cv"] == pytest.approx(cv, abs=1e-4)
    varied = measurement.training["predicted_samples_s_at_measured_work_and_cv"]
    assert varied == pytest.approx(replayed, rel=max(0.05, 2 * cv))
    # Both reports' shared sections come from one builder (hetsim.report_sections): same fields.
    for section in ("throughput", "window", "staleness", "sync"):
        assert getattr(prediction, section).keys() == getattr(measurement, section).keys(), section


def test_the_validation_suite_has_24_plans_or_more_over_every_zoo_family_each_cut_within_its_model():
    import sys
    from pathlib import Path

    import modelzoo
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "experiments" / "validation"))
    from suite import MODEL_KWARGS, cases
    suite = cases()
    assert len(suite) >= 24 and len({c.name for c in suite}) == len(suite)
    families = ("mlp", "gpt2", "llama", "resnet", "vgg", "alexnet", "squeezenet", "densenet", "inception")
    assert all(any(c.plan.model.startswith(f) for c in suite) for f in families)
    for case in suite:
        net, _ = modelzoo.build(case.plan.model, device="meta", **(case.model_kwargs or MODEL_KWARGS))
        n_layers = len(modelzoo.layer_graph(net))
        for vw in case.plan.virtual_workers:
            assert vw.stages[0].layers[0] == 0 and vw.stages[-1].layers[1] == n_layers, case.name


def test_a_deepspeed_plan_with_blocking_sends_is_refused_before_any_measuring():
    """The executor's DeepSpeed transfers are gloo rendezvous; a prediction of NCCL-like blocking sends
    would be compared with something else."""
    from executor.validate import validate_plan
    from hetsim.errors import HetsimError
    plan = replace(mlp_plan([[0, 4, 9]], nm=2, schedule="1f1b-deepspeed"), blocking_p2p=True)
    with pytest.raises(HetsimError, match="^blocking_p2p: under 1f1b-deepspeed .* drop it to validate$"):
        validate_plan(plan, waves=4, warmup_waves=1)


def test_a_plan_whose_ranks_exceed_the_memory_they_share_is_refused_before_the_run():
    from executor.validate import fits_host
    from hetsim.errors import PlanError
    from hetsim.feasibility import plan_memory
    from hetsim.gpu import GpuType
    from modelzoo.counting import counted_profile
    plan, counted = mlp_plan([[0, 3, 6, 9]], nm=2, schedule="1f1b"), counted_profile("mlp", 16)[0]
    profile = replace(counted, layers=tuple(replace(l, fwd_s={"cpu": 1e-3}, bwd_s={"cpu": 2e-3})
                                            for l in counted.layers))
    need = [m.total_bytes for m in plan_memory(plan, host_cluster(3, 2, 1e9, 0.0), profile).values()]
    small = lambda capacity, kind="cpu": host_cluster(3, 2, 1e9, 0.0, device_type=GpuType(
        name=kind, display_name=f"{kind} slot", memory_bytes=capacity, memory_bandwidth_Bps=1e10,
        peak_fp32_flops=5e10, peak_fp16_flops=5e10))
    profile = replace(profile, layers=tuple(replace(l, fwd_s={**l.fwd_s, "cuda": 1e-3}, bwd_s={**l.bwd_s, "cuda": 2e-3})
                                            for l in profile.layers))
    fits_host(plan, small(sum(need)), profile, memories=1)               # exactly enough
    with pytest.raises(PlanError, match=r"^plan: 3 ranks share this host's memory \(cpu slot, .* GiB\) and need "
                                        r".* together \(the fullest, host/gpu0: weights .*lower Nm or the minibatch$"):
        fits_host(plan, small(sum(need) - 1), profile, memories=1)
    # Two memories, ranks round-robin: host/gpu0 and host/gpu2 on one, host/gpu1 on the other.
    fits_host(plan, small(need[0] + need[2], "cuda"), profile, memories=2)
    with pytest.raises(PlanError, match=r"^plan: 2 ranks share GPU 0 \(cuda slot, .*\(the fullest, host/gpu0: "):
        fits_host(plan, small(need[0] + need[2] - 1, "cuda"), profile, memories=2)
    fits_host(plan, small(max(need)), profile, memories=None)            # a device each: each fits
    with pytest.raises(PlanError, match=r"^plan: stage 0 of vw0 on host/gpu0 .* needs"):
        fits_host(plan, small(max(need) - 1), profile, memories=None)


@pytest.mark.parametrize("device,ranks,gpus,want", [("cpu", 4, 0, 1), ("cuda:1", 3, 4, 1), ("cuda", 3, 2, 2),
                                                    ("cuda", 2, 2, None), ("cuda", 1, 8, None)])
def test_stage_ranks_share_memories_as_the_executor_places_them(device, ranks, gpus, want):
    from executor.validate import shared_memories
    assert shared_memories(device, ranks, gpus) == want


def test_validate_refuses_a_plan_over_this_hosts_memory_before_measuring_in_the_plans_gpu_names(monkeypatch):
    import executor.validate as v
    from executor.validate import validate_plan
    from hetsim.errors import PlanError
    monkeypatch.setattr(v, "_host_now", lambda *a, **k: pytest.fail("measured the host for a plan that cannot run"))
    monkeypatch.setattr(v, "cpu_type", lambda: v.GpuType(name="cpu", display_name="CPU rank", memory_bytes=2 << 30,
                                                          memory_bandwidth_Bps=1e10, peak_fp32_flops=5e10,
                                                          peak_fp16_flops=5e10))
    plan = Plan(name="p", model="mlp", minibatch_size=16, nm=2, schedule="1f1b", sync=SyncSpec(),
                virtual_workers=(VirtualWorker(name="a", stages=(StageSpec(gpu="n1/gpu3", layers=(0, 4)),
                                                                 StageSpec(gpu="n0/gpu0", layers=(4, 9)))),))
    # 0.5 GiB of weights a stage, each stage 1.25 GiB in all: each fits, together they do not.
    with pytest.raises(PlanError, match=r"^plan: 2 ranks share this host's memory \(CPU rank, 2.0 GiB\) and need 2.5. GiB "
                                        r"together \(the fullest, n0/gpu0: weights 0.50 \+"):
        validate_plan(plan, model_kwargs={"hidden": 8192}, waves=4, warmup_waves=1)
    with pytest.raises(PlanError, match=r"^plan: stage 0 of a on n1/gpu3 \(CPU rank, 2.0 GiB\) needs 4.0. GiB"):
        validate_plan(plan, model_kwargs={"hidden": 16384}, waves=4, warmup_waves=1)


def test_model_arguments_a_model_cannot_be_built_with_are_one_line_naming_the_flag():
    from executor.launch import check_job_plan
    from hetsim.errors import HetsimError
    plan = Plan(name="p", model="gpt2-small", minibatch_size=4, nm=1, schedule="gpipe", sync=SyncSpec(),
                virtual_workers=(VirtualWorker(name="a", stages=(StageSpec(gpu="g0", layers=(0, 5)),)),))
    with pytest.raises(HetsimError, match=r"^--model-arg: model gpt2-small: d_model 768 is not a multiple of n_head 5$"):
        check_job_plan(plan, None, "gpt2-small", {"n_layer": 2, "n_head": 5})
