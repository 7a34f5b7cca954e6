"""The paper experiments (experiments/*/run.py) as CI runs them, --quick, and the table writer they
share (experiments/report_table.py)."""

from __future__ import annotations

import csv
import importlib.util
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def load(name: str, script: str = "run.py"):
    """experiments/NAME/SCRIPT as a module (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(f"{name}_{Path(script).stem}_experiment", EXPERIMENTS / name / script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module            # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def quick_rows(name: str, out: Path, table: str) -> list[dict[str, str]]:
    assert load(name).main(["--quick", "--out", str(out)]) == 0
    with open(out / f"{table}.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_the_shared_writer_keeps_every_column_and_the_markdown_it_is_given(tmp_path):
    load("antichain")                           # puts experiments/ on sys.path, as every script does
    from report_table import markdown_table, write_results
    table = markdown_table(["a", "b"], [[1, "x"], [2.5, "-"]])
    assert table == "| a | b |\n|---|---|\n| 1 | x |\n| 2.5 | - |\n"
    assert write_results([{"a": 1}, {"a": 2, "b": 3}], tmp_path / "r", "t", table) == table
    assert (tmp_path / "r" / "t.csv").read_text().splitlines() == ["a,b", "1,", "2,3"]
    assert (tmp_path / "r" / "t.md").read_text() == table


def test_quick_and_out_options_edit_the_default_config(tmp_path):
    module = load("antichain")
    from report_table import experiment_config
    config = experiment_config(module.Config(), module.quick, ["--quick", "--out", str(tmp_path)],
                               description="d", quick_help="h")
    assert config.models == module.quick(module.Config()).models and config.out == tmp_path
    assert experiment_config(module.Config(), module.quick, [], description="d", quick_help="h") == module.Config()


def test_antichain_quick_cuts_every_model_on_4_and_8_gpus_within_its_bottleneck_bound(tmp_path):
    rows = quick_rows("antichain", tmp_path, "table1")
    assert [(r["model"], r["gpus"]) for r in rows] == [(m, g) for m in ("vgg16", "resnet50", "squeezenet1_0")
                                                       for g in ("4", "8")]
    assert all(1 < float(r["simulated_speedup"]) <= float(r["dp_speedup"]) * 1.01 for r in rows)
    assert "| vgg16 | 4 |" in (tmp_path / "table1.md").read_text()


def test_pipedream_quick_prints_its_formulas_configuration_beside_the_paper(tmp_path):
    rows = quick_rows("pipedream", tmp_path, "configurations")
    assert [(r["cluster"], r["model"]) for r in rows] == [("pipedream_cluster_a", "vgg16"),
                                                          ("pipedream_cluster_b", "vgg16")]
    assert rows[0]["paper_config"] == "15-1" and all(int(r["flat_gpus"]) <= 16 for r in rows)
    assert "| A | vgg16 | 128 |" in (tmp_path / "configurations.md").read_text()


def test_sdpipe_quick_puts_sdpipe_ahead_of_allreduce_under_stragglers(tmp_path):
    rows = quick_rows("sdpipe", tmp_path, "throughput")
    for n in ("2", "4"):
        by = {r["sync"]: float(r["stragglers_samples_per_s"]) for r in rows if r["pipelines"] == n}
        assert by["SDPipe P=10"] > by["all-reduce"]
    assert (tmp_path / "throughput.png").stat().st_size > 0


def test_hetpipe_quick_writes_a_row_per_policy_and_d_and_a_figure(tmp_path):
    rows = quick_rows("hetpipe", tmp_path, "throughput")
    module = load("hetpipe")
    config = module.quick(module.Config())
    vgg = [r for r in rows if r["model"] == "VGG-19"]
    assert {(r["policy"], int(r["D"])) for r in vgg} >= {(p, d) for p in config.policies for d in config.staleness}
    assert any(r["policy"] == "Horovod (BSP)" for r in vgg)
    assert all(float(r["samples_per_s"]) > 0 for r in rows)
    assert (tmp_path / "throughput.png").stat().st_size > 0
    assert "| VGG-19 | ED |" in (tmp_path / "throughput.md").read_text()


def test_merging_validation_parts_keeps_the_last_row_of_a_plan_run_again(tmp_path):
    module = load("validation")
    first, again = tmp_path / "all.csv", tmp_path / "again.csv"
    first.write_text("plan,predicted_samples_s,measured_samples_s,error_pct\n"
                     "s2_nm2_1f1b,101,100,1.0\ns1_nm1_gpipe,98,100,-2.0\n")
    again.write_text("plan,predicted_samples_s,measured_samples_s,error_pct,handoff_us\ns2_nm2_1f1b,103,100,3.0,500\n")
    for path in (first, again):
        path.with_name(path.stem + "_summary.json").write_text("{}")
    module.merge([str(first), str(again)], tmp_path / "out", "merged")
    with open(tmp_path / "out" / "merged.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["plan"], r["error_pct"], r["handoff_us"]) for r in rows] == [
        ("s1_nm1_gpipe", "-2.0", ""), ("s2_nm2_1f1b", "3.0", "500")]     # suite order, the re-run's row


def test_the_validation_summary_gives_the_simulators_share_of_the_error_beside_the_whole():
    module = load("validation")
    rows = [{"error_pct": 10.0, "error_at_measured_work_pct": -1.0}, {"error_pct": -4.0, "error_at_measured_work_pct": 3.0},
            {"error_pct": 2.0, "error_at_measured_work_pct": ""}]       # "": that run's work was not compared
    summary = module.summarise(rows, {})
    assert (summary["median_abs_error_pct"], summary["max_abs_error_pct"]) == (4.0, 10.0)
    assert summary["at_measured_work"] == {"median_abs_error_pct": 2.0, "max_abs_error_pct": 3.0}
    assert "at_measured_work" not in module.summarise([{"error_pct": 1.0}], {})
    rows[0]["error_at_measured_work_and_cv_pct"] = -6.0     # with the run's pass-to-pass variability too
    assert module.summarise(rows, {})["at_measured_work_and_cv"] == {"median_abs_error_pct": 6.0,
                                                                     "max_abs_error_pct": 6.0}


def test_time_to_accuracy_gives_the_simulators_share_of_the_rate_error_only_where_every_seed_has_it():
    module = load("time_to_accuracy")
    run = lambda measured, at_work: {"measured": {"samples_per_s": measured},
                                     "predicted": {"samples_per_s": 2 * measured,
                                                   "samples_per_s_at_measured_work": at_work}}
    # The medians compared, as the rate error compares them: 110 against 100.
    assert module.rate_at_measured_work([run(100.0, 110.0), run(200.0, 190.0), run(100.0, 104.0)]) == 10.0
    assert module.rate_at_measured_work([run(100.0, 110.0), run(100.0, None)]) is None


def test_local_staleness_weighs_the_stale_first_stage_by_its_weights_and_its_fit_recovers_known_costs():
    module = load("time_to_accuracy", "local_staleness.py")
    weights = [1, 0, 3, 0, 4]                # the first stage of (0, 1) holds 1 of 8, of (0, 3) 4 of 8
    run = lambda cuts: {"name": "x", "plan": {
        "schedule": "1f1b", "nm": 2, "minibatch_size": 128, "sync": {"mode": "none"},
        "virtual_workers": [{"name": f"vw{v}", "stages": [{"layers": [0, c]}, {"layers": [c, 5]}]}
                            for v, c in enumerate(cuts)]},
        "predicted": {"staleness": {"local": {"mean": 0.5}}}}
    assert module.features(run([1]), weights) == (128, 0.125, 0.0, 1.0)
    assert module.features(run([3]), weights) == (128, 0.5, 0.0, 1.0)
    assert module.features(run([1, 3]), weights)[1] == 0.3125      # the VWs' mean
    # Observations made by the formula itself: the fit finds them again, also a cost that is small
    # enough for the grid to start it at 0.
    points = [(128, 0, 0, 1), (512, 0, 0, 1), (128, 0.5, 0, 1), (128, 0.5, 2, 2), (128, 0.5, 4, 1.6)]
    for truth in ([900.0, 100.0, 1.5, 0.2, 2.0], [900.0, 100.0, 1.5, 0.007, 2.0]):
        fitted = module.fit([(f, module.samples(truth, f)) for f in points])
        assert all(abs(module.samples(fitted, f) / module.samples(truth, f) - 1) < 1e-3 for f in points)
        assert fitted[2:] == pytest.approx(truth[2:], rel=0.05)
