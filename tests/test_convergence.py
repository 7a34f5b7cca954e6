"""hetsim.convergence: the statistical-efficiency model's closed forms, its fit, and ranking by time."""

from __future__ import annotations

import json
import math

import pytest

import hetsim
from conftest import TINY_CLUSTER_YAML
from hetsim.cluster import Cluster, GpuSlot, LinkSpec, Node
from hetsim.convergence import (ConvergenceModel, Observation, TargetFit, crossing, dynamics_of, fit_target,
                                load_convergence, rank_by_time, samples_to_target, time_to_target, vw_busy)
from hetsim.errors import HetsimError, SpecError
from hetsim.gpu import GIB, GpuType
from hetsim.plan import Plan, StageSpec, SyncSpec, VirtualWorker
from hetsim.profile import LayerProfile, ModelProfile


def _plan_doc(n_vw: int, nm: int, schedule: str, mode: str, batch: int = 32) -> dict:
    return {"name": "p", "virtual_workers": [{}] * n_vw, "nm": nm, "schedule": schedule, "minibatch_size": batch,
            "sync": {"mode": mode}}


def _staleness(local: float, global_: float | None = None) -> dict:
    out = {"local": {"mean": local}}
    if global_ is not None:
        out["global"] = {"mean": global_}
    return out


def test_samples_to_target_closed_forms():
    flat = TargetFit(loss=1.0, samples_min=1000.0, noise_batch=None, staleness_cost=0.0)
    assert samples_to_target(flat, 4096, 0) == 1000.0              # no batch effect fitted
    fit = TargetFit(loss=1.0, samples_min=1000.0, noise_batch=256.0, staleness_cost=0.5)
    assert samples_to_target(fit, 256, 0) == pytest.approx(2000.0)  # at the noise scale: twice the minimum
    assert samples_to_target(fit, 256, 2) == pytest.approx(4000.0)  # 2 updates stale at cost 0.5: twice again
    assert samples_to_target(fit, 0, 0) == pytest.approx(1000.0)
    two = TargetFit(loss=1.0, samples_min=1000.0, noise_batch=None, staleness_cost=0.0, async_cost=0.25)
    assert samples_to_target(two, 128, 0, async_vws=3) == pytest.approx(1500.0)   # 2 VWs beyond the first


@pytest.mark.parametrize("plan, staleness, update_batch, effective, mode, async_vws", [
    (_plan_doc(1, 4, "1f1b", "none"), _staleness(1.5), 32, 1.5, "async", 1),         # per-minibatch updates
    (_plan_doc(1, 4, "gpipe", "none"), _staleness(0.0), 128, 0.0, "sync", 1),        # one step per flush of Nm
    (_plan_doc(2, 4, "1f1b-flush", "bsp"), _staleness(0.0), 256, 0.0, "bsp", 1),     # Nm x VWs averaged
    (_plan_doc(3, 2, "1f1b", "wsp"), _staleness(0.5, 1.25), 32, 0.5 + 1.25 * 2 * 2, "wsp", 3),
    (_plan_doc(2, 3, "gpipe", "wsp"), _staleness(0.0, 2.0), 96, 2.0, "wsp", 2),      # a flush: one update per wave
    (_plan_doc(4, 2, "1f1b", "sdpipe"), _staleness(0.5), 32, 0.5, "sdpipe", 4),
])
def test_dynamics_of_a_plan(plan, staleness, update_batch, effective, mode, async_vws):
    d = dynamics_of(plan, staleness)
    assert (d.update_batch, d.mode, d.async_vws) == (update_batch, mode, async_vws)
    assert d.staleness == pytest.approx(effective)


def test_asynchronous_vws_count_in_units_of_the_fastest_pace():
    """Two WSP VWs, the second half as fast (its busiest GPU twice as busy at the common rate): 1.5 VWs;
    level VWs count whole; a VW count without busy figures stays the plan's."""
    plan = {**_plan_doc(2, 2, "1f1b", "wsp"), "virtual_workers": [{"name": "vw0"}, {"name": "vw1"}]}
    gpus = [{"vw": "vw0", "busy_fraction": 0.2}, {"vw": "vw0", "busy_fraction": 0.4},
            {"vw": "vw1", "busy_fraction": 0.8}, {"vw": "vw1", "busy_fraction": 0.5}]
    assert vw_busy(gpus) == {"vw0": 0.4, "vw1": 0.8}
    assert dynamics_of(plan, _staleness(0.5, 0.0), vw_busy(gpus)).async_vws == pytest.approx(1.5)
    assert dynamics_of(plan, _staleness(0.5, 0.0), {"vw0": 0.7, "vw1": 0.7}).async_vws == pytest.approx(2.0)
    assert dynamics_of(plan, _staleness(0.5, 0.0)).async_vws == 2.0
    bsp = {**_plan_doc(2, 2, "1f1b-flush", "bsp"), "virtual_workers": plan["virtual_workers"]}
    assert dynamics_of(bsp, _staleness(0.0), vw_busy(gpus)).async_vws == 1.0     # synchronous: no asynchrony


def test_fit_recovers_known_constants_from_synthetic_runs():
    truth = TargetFit(loss=0.9, samples_min=5000.0, noise_batch=700.0, staleness_cost=0.3, async_cost=0.8)
    runs = [(b, s, v) for b in (64, 256, 1024) for s in (0.0, 1.0, 3.0) for v in (1, 2, 4)]
    obs = [Observation(update_batch=b, staleness=s, async_vws=v, samples=samples_to_target(truth, b, s, v))
           for b, s, v in runs]
    got = fit_target(0.9, obs)
    assert got.samples_min == pytest.approx(5000.0, rel=1e-3)
    assert got.noise_batch == pytest.approx(700.0, rel=1e-3)
    assert got.staleness_cost == pytest.approx(0.3, rel=1e-3)
    assert got.async_cost == pytest.approx(0.8, rel=1e-3)


def test_fit_with_one_update_batch_leaves_the_batch_effect_out():
    truth = TargetFit(loss=0.9, samples_min=3000.0, noise_batch=None, staleness_cost=0.2)
    obs = [Observation(update_batch=128, staleness=s, samples=samples_to_target(truth, 128, s)) for s in (0, 1, 4)]
    got = fit_target(0.9, obs)
    assert got.noise_batch is None and got.async_cost == 0.0
    assert (got.samples_min, got.staleness_cost) == (pytest.approx(3000.0, rel=1e-3), pytest.approx(0.2, rel=1e-3))
    with pytest.raises(HetsimError, match="at least 2 runs"):
        fit_target(0.9, obs[:1])


def test_crossing_reads_the_moving_mean_of_every_vw_in_time_order():
    curve = [(0, 0, 0.1, 2.0), (1, 0, 0.2, 1.6), (0, 1, 0.3, 1.2), (1, 1, 0.4, 1.0), (0, 2, 0.5, 0.6)]
    assert crossing(curve, 1.1, 2) == (4, 0.4)          # mean of 1.2 and 1.0
    assert crossing(curve, 2.0, 1) == (1, 0.1)
    assert crossing(curve, 0.5, 2) is None


def test_the_shipped_entry_loads_and_names_its_targets():
    model = load_convergence("mlp")
    assert model is not None and model.task == "teacher"
    assert model.at(None).loss == model.default_target
    with pytest.raises(HetsimError, match="fitted for target losses"):
        model.at(123.0)
    assert load_convergence("no-such-model") is None


def test_a_malformed_entry_names_the_field(tmp_path):
    path = tmp_path / "convergence.yaml"
    path.write_text("entries:\n  - model: m\n    task: teacher\n    minibatch_size: 8\n    smoothing: 4\n"
                    "    default_target: 1.0\n    targets:\n      - {loss: 1.0, samples_min: -5, staleness_cost: 0}\n")
    with pytest.raises(SpecError, match=r"targets\[0\]\.samples_min: must be > 0"):
        load_convergence("m", path=path)


@pytest.mark.parametrize("extra,message", [
    ("    trained_with: momentum\n", r"trained_with: expected a mapping"),
    ("    update_batches: [512, 128]\n", r"update_batches: expected \[smallest, largest\]"),
    ("", r"targets\[1\]\.loss: 1 is fitted twice"),
])
def test_a_malformed_entry_is_one_line_naming_its_field(tmp_path, extra, message):
    twice = "      - {loss: 1.0, samples_min: 7, staleness_cost: 0}\n" if not extra else ""
    path = tmp_path / "convergence.yaml"
    path.write_text("entries:\n  - model: m\n    task: teacher\n    minibatch_size: 8\n    smoothing: 4\n"
                    "    default_target: 1.0\n" + extra + "    targets:\n"
                    "      - {loss: 1.0, samples_min: 5, staleness_cost: 0}\n" + twice)
    with pytest.raises(SpecError, match=message):
        load_convergence("m", path=path)


def test_update_batches_outside_the_fitted_range_are_named():
    from dataclasses import replace
    from hetsim.convergence import range_note
    model = load_convergence("mlp")
    assert model.update_batches == (128, 512)
    assert range_note(model, [128, 256, 512]) == ""
    assert "update batch 1024, 4096 lies outside the 128-512" in range_note(model, [512, 1024, 4096])
    assert range_note(replace(model, update_batches=None), [4096]) == ""


def test_samples_and_time_refuse_what_has_no_meaning():
    fit = TargetFit(loss=1.0, samples_min=1000.0, noise_batch=100.0, staleness_cost=0.1, async_cost=0.5)
    for args in [(-128, 0, 1), (128, -1, 1), (128, 0, 0.5), (128, math.nan, 1)]:
        with pytest.raises(HetsimError, match="samples_to_target"):
            samples_to_target(fit, *args)
    with pytest.raises(HetsimError, match="has no throughput"):
        time_to_target(_model(0.0), _simulated("gpipe"), samples_per_s=math.inf)


# ranking by time to accuracy, on simulated reports --------------------------------------------------
CPU = GpuType(name="cpu", display_name="CPU", memory_bytes=8 * GIB, memory_bandwidth_Bps=1e10,
              peak_fp32_flops=1e11, peak_fp16_flops=1e11, sources=("test",))


def _cluster() -> Cluster:
    slots = tuple(GpuSlot(id=f"host/gpu{i}", node="host", index=i, type=CPU) for i in range(2))
    link = LinkSpec(kind="loopback", bandwidth_Bps=5e9, latency_s=2e-5)
    return Cluster(name="two", nodes=(Node(name="host", gpus=slots, intra_link=link),), network=link,
                   ps_nodes=("host",))


def _profile() -> ModelProfile:
    layers = tuple(LayerProfile(name=f"l{i}", kind="Linear", param_bytes=1000, output_bytes=1000,
                                fwd_s={"cpu": 1e-3}, bwd_s={"cpu": 2e-3}) for i in range(4))
    return ModelProfile(model="toy", batch_size=16, layers=layers, input_bytes=1000,
                        edges=tuple((i, i + 1) for i in range(3)), source="nominal")


def _simulated(schedule: str):
    stages = (StageSpec(gpu="host/gpu0", layers=(0, 2)), StageSpec(gpu="host/gpu1", layers=(2, 4)))
    plan = Plan(name=schedule, model="toy", minibatch_size=16, nm=4, schedule=schedule, sync=SyncSpec(),
                virtual_workers=(VirtualWorker(name="vw0", stages=stages),))
    return hetsim.simulate(_cluster(), _profile(), plan, waves=10, warmup_waves=2)


def _model(cost: float) -> ConvergenceModel:
    return ConvergenceModel(model="toy", task="teacher", minibatch_size=16, smoothing=4, default_target=1.0,
                            targets=(TargetFit(loss=1.0, samples_min=2000.0, noise_batch=None, staleness_cost=cost),))


def test_time_to_accuracy_ranks_the_stale_faster_plan_last_when_staleness_costs_more_than_it_buys():
    stale, flushed = _simulated("1f1b"), _simulated("gpipe")
    gain = stale.throughput["samples_per_s"] / flushed.throughput["samples_per_s"]
    s = dynamics_of(stale.plan, stale.staleness).staleness
    assert gain > 1 and s > 0 and dynamics_of(flushed.plan, flushed.staleness).staleness == 0
    # Staleness costs (1 + cost s) more samples; the asynchronous plan wins iff that is below its gain.
    # (Without a batch effect in the model, the flush's larger update batch costs nothing.)
    for cost, winner in ((0.5 * (gain - 1) / s, "1f1b"), (2.0 * (gain - 1) / s, "gpipe")):
        model = _model(cost)
        ranked = rank_by_time([(r.plan["name"], time_to_target(model, r)) for r in (stale, flushed)])
        assert ranked[0][0] == winner
    t = time_to_target(_model(0.0), flushed)
    assert t.seconds == pytest.approx(2000.0 / flushed.throughput["samples_per_s"])
    assert math.isclose(t.minibatches, 2000.0 / 16)


# the command line ---------------------------------------------------------------------------------


def _mlp_profile_yaml() -> str:
    layer = ("- {{name: l{i}, kind: Linear, param_bytes: 4000000, output_bytes: 500000, "
             "fwd_s: {{rtx-2060: 0.002}}, bwd_s: {{rtx-2060: 0.004}}}}")
    layers = "\n".join(layer.format(i=i) for i in range(4))
    return f"model: mlp\nbatch_size: 128\ninput_bytes: 32768\nsource: test\nlayers:\n{layers}\n"


def test_simulate_reports_time_to_the_entrys_default_target(tmp_path, capsys):
    from hetsim.cli import main
    (tmp_path / "c.yaml").write_text(TINY_CLUSTER_YAML)
    (tmp_path / "p.yaml").write_text(_mlp_profile_yaml())
    plan = {"name": "p", "model": "mlp", "minibatch_size": 128, "nm": 2, "schedule": "1f1b", "sync": {"mode": "none"},
            "virtual_workers": [{"name": "vw0", "stages": [{"gpu": "node0/gpu0", "layers": [0, 2]},
                                                           {"gpu": "node0/gpu1", "layers": [2, 4]}]}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    args = ["simulate", "--cluster", str(tmp_path / "c.yaml"), "--profile", str(tmp_path / "p.yaml"),
            "--plan", str(tmp_path / "plan.json"), "--waves", "6"]
    assert main(args + ["--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    entry = load_convergence("mlp")
    section = doc["time_to_accuracy"]
    assert section["target_loss"] == entry.default_target
    assert section["seconds"] == pytest.approx(section["samples"] / doc["throughput"]["samples_per_s"])
    assert main(args) == 0
    assert "time to loss" in capsys.readouterr().out
    assert main(args + ["--target-loss", "0.123"]) == 2
    assert "--target-loss 0.123" in capsys.readouterr().err


def test_plan_ranks_by_time_to_accuracy_or_names_the_missing_entry(tmp_path, capsys):
    from hetsim.cli import main
    (tmp_path / "c.yaml").write_text(TINY_CLUSTER_YAML)
    (tmp_path / "p.yaml").write_text(_mlp_profile_yaml())
    args = ["plan", "--cluster", str(tmp_path / "c.yaml"), "--model", str(tmp_path / "p.yaml"), "--nm", "1,2",
            "--staleness", "0,2", "--waves", "6", "--jobs", "1", "--objective", "time-to-accuracy"]
    assert main(args + ["--out", str(tmp_path / "best.json")]) == 0
    out = capsys.readouterr().out
    table = out[out.index("fastest first"):].split("\n\n")[0].splitlines()[2:]
    seconds = [float(line.split()[-1]) for line in table]
    assert len(seconds) >= 2 and seconds == sorted(seconds)
    best = json.loads((tmp_path / "best.json").read_text())      # the written plan is the fastest to the target
    _, _, nm, d, *_ = table[0].split()
    assert (best["nm"], best["sync"].get("staleness_bound", 0)) == (int(nm), int(d))
    (tmp_path / "p.yaml").write_text(_mlp_profile_yaml().replace("model: mlp", "model: toy"))
    assert main(args) == 2
    assert "no convergence entry for model 'toy'" in capsys.readouterr().err


def test_an_entry_fitted_with_another_optimizer_predicts_no_time_to_accuracy(tmp_path, capsys):
    from hetsim.cli import main
    assert load_convergence("mlp").trained_with["optimizer"] == "momentum"
    (tmp_path / "c.yaml").write_text(TINY_CLUSTER_YAML)
    (tmp_path / "p.yaml").write_text(_mlp_profile_yaml())
    plan = {"name": "p", "model": "mlp", "minibatch_size": 128, "nm": 2, "schedule": "1f1b", "sync": {"mode": "none"},
            "optimizer": "adam", "virtual_workers": [{"name": "vw0", "stages": [
                {"gpu": "node0/gpu0", "layers": [0, 2]}, {"gpu": "node0/gpu1", "layers": [2, 4]}]}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    args = ["simulate", "--cluster", str(tmp_path / "c.yaml"), "--profile", str(tmp_path / "p.yaml"),
            "--plan", str(tmp_path / "plan.json"), "--waves", "6"]
    assert main(args + ["--json"]) == 0
    assert "time_to_accuracy" not in json.loads(capsys.readouterr().out)
    assert main(args + ["--target-loss", "1.2"]) == 2
    assert "fitted on runs training with momentum, and the plan trains with adam" in capsys.readouterr().err
    assert main(["plan", "--cluster", str(tmp_path / "c.yaml"), "--model", str(tmp_path / "p.yaml"), "--nm", "2",
                 "--waves", "6", "--jobs", "1", "--objective", "time-to-accuracy", "--optimizer", "adam"]) == 2
    assert "the plan trains with adam" in capsys.readouterr().err


def test_time_to_accuracy_ranking_says_what_it_cannot_do(tmp_path, capsys):
    """No simulated candidate: refused, not an empty table over the throughput pick; a minibatch other
    than the entry's: a note; the printed command keeps the target."""
    from hetsim.cli import main
    (tmp_path / "c.yaml").write_text(TINY_CLUSTER_YAML)
    (tmp_path / "p.yaml").write_text(_mlp_profile_yaml())
    args = ["plan", "--cluster", str(tmp_path / "c.yaml"), "--model", str(tmp_path / "p.yaml"), "--nm", "2",
            "--waves", "6", "--jobs", "1", "--objective", "time-to-accuracy"]
    assert main(args + ["--cost-model", "pipedream"]) == 2
    assert "needs simulated candidates" in capsys.readouterr().err
    assert main(args + ["--batch", "32"]) == 0
    assert "fitted on runs at minibatch 128, the plan trains at 32" in capsys.readouterr().out
    assert main(args + ["--target-loss", "1.2", "--out", str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    assert "fitted on runs at minibatch" not in out and out.rstrip().endswith("--target-loss 1.2`")


def test_time_to_accuracy_ranking_uses_the_searchs_own_simulation_of_each_plan(tmp_path):
    """The search keeps each simulated plan's update batch and staleness: they are what a simulation
    of that plan at the search's settings gives, so ranking by time needs no second run."""
    from hetsim.cluster import load_cluster
    from hetsim.convergence import rank_plans
    from hetsim.planner.search import SearchSpace, search_plans
    (tmp_path / "c.yaml").write_text(TINY_CLUSTER_YAML)
    (tmp_path / "p.yaml").write_text(_mlp_profile_yaml())
    cluster, profile = load_cluster(tmp_path / "c.yaml"), hetsim.load_profile(tmp_path / "p.yaml")
    space = SearchSpace(nm_values=(1, 2), staleness_values=(0, 2), waves=6, workers=1)
    result, _ = rank_plans(search_plans(cluster, profile, space), cluster, profile, space)
    simulated = [c for c in result.candidates if c.simulated_mb_s is not None]
    assert len(simulated) >= 2
    for c in simulated:
        again = hetsim.simulate(cluster, profile, c.plan, waves=space.waves, warmup_waves=space.warmup_waves,
                                seed=space.seed, jitter_cv=space.jitter_cv, trace=False)
        assert c.dynamics == dynamics_of(again.plan, again.staleness, vw_busy(again.gpus))


def test_a_profile_of_another_size_than_the_entrys_model_gets_a_note(tmp_path, capsys):
    """A profile named mlp that is not the fitted mlp (another width or depth) is another model: the
    prediction says so; the fitted size itself does not."""
    from hetsim.cli import main
    entry = load_convergence("mlp")
    assert entry.param_bytes
    (tmp_path / "c.yaml").write_text(TINY_CLUSTER_YAML)
    plan = {"name": "p", "model": "mlp", "minibatch_size": 128, "nm": 1, "schedule": "1f1b", "sync": {"mode": "none"},
            "virtual_workers": [{"name": "vw0", "stages": [{"gpu": "node0/gpu0", "layers": [0, 4]}]}]}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    args = ["simulate", "--cluster", str(tmp_path / "c.yaml"), "--profile", str(tmp_path / "p.yaml"),
            "--plan", str(tmp_path / "plan.json"), "--waves", "6", "--json"]
    notes = {}
    for size in (entry.param_bytes, 4 * 4_000_000):
        (tmp_path / "p.yaml").write_text(_mlp_profile_yaml().replace("param_bytes: 4000000", "param_bytes: 0", 3)
                                         .replace("param_bytes: 4000000", f"param_bytes: {size}"))
        assert main(args) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["time_to_accuracy"]
        notes[size] = [n for n in doc["notes"] if "entry was fitted on a mlp of" in n]
    assert notes[entry.param_bytes] == [] and len(notes[4 * 4_000_000]) == 1
