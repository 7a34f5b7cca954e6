"""executor.options and executor.launch's job checks: bad options and arguments are one line before
any rank starts (the Python API's as the CLI's)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

import executor
from executor import ExecOptions
from executor.launch import make_job
from hetsim.errors import HetsimError

PLAN = str(Path(__file__).resolve().parents[2] / "experiments" / "validation" / "plans" / "wsp_2vw_example.json")


@pytest.mark.parametrize("options, message", [
    ({"timeout_s": math.nan}, "timeout_s in (0, 86400]"),
    ({"timeout_s": 1e300}, "timeout_s in (0, 86400]"),
    ({"lr": -1.0}, "lr must be finite and > 0"),
    ({"momentum": 5.0}, "momentum in [0, 1)"),
    ({"waves": "3"}, "waves and warmup_waves must be whole numbers"),
    ({"waves": 2.5}, "waves and warmup_waves must be whole numbers"),
    ({"threads": 2.5}, "threads must be a whole number"),
    ({"slowdown": None}, "slowdown must be a mapping"),
    ({"slowdown": {"host/gpu1": math.inf}}, "slowdown[host/gpu1]: an emulated slowdown must be finite and >= 1"),
    ({"slowdown": {"host/gpu1": "2"}}, "slowdown[host/gpu1]: expected a number, got '2'"),
    ({"seed": 2**64}, "seed: expected a whole number in [0, 2**63)"),
    ({"seed": "x"}, "seed: expected a whole number"),
    ({"lr": "0.1"}, "lr: expected a number, got '0.1'"),
    ({"timeout_s": "5"}, "timeout_s: expected a number"),
    ({"checkpoint_dir": 5}, "checkpoint_dir: expected a folder path, got 5"),
    ({"fault": "1:ZZ:die"}, "fault '1:ZZ:die': not an action"),
])
def test_bad_options_are_refused_naming_them(options, message):
    with pytest.raises(HetsimError) as err:
        ExecOptions(**options)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("kwargs, message", [
    ({"plan": None}, "plan: expected a Plan, a file path or a shipped name, got NoneType"),
    ({"cluster": {}}, "cluster: expected a Cluster"),
    ({"options": {"waves": 2}}, "options must be an ExecOptions"),
    ({"model_kwargs": [("hidden", 8)]}, "model_kwargs a dict"),
    ({"model_kwargs": {"hidden": 0}}, "model_kwargs: hidden=0: a model's sizes are whole numbers >= 1"),
    ({"options": ExecOptions(slowdown={"nosuch/gpu0": 2.0})}, "slowdown: nosuch/gpu0: plan wsp_2vw_example has no GPU"),
])
def test_a_job_that_cannot_run_is_refused_before_any_rank_starts(kwargs, message):
    args = {"plan": PLAN, "cluster": "cpu_host"} | kwargs
    with pytest.raises(HetsimError, match=message.replace("[", r"\[").replace("(", r"\(")):
        make_job(args.pop("plan"), args.pop("cluster"), **args)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_a_mixed_precision_plan_is_refused_before_any_rank_starts(precision):
    from dataclasses import replace
    from hetsim.plan import load_plan
    from executor.launch import check_job_plan
    plan = replace(load_plan(PLAN), precision=precision)
    with pytest.raises(HetsimError, match=f"precision {precision}: the executor trains with FP32 weights"):
        make_job(plan, "cpu_host")
    with pytest.raises(HetsimError, match=f"precision {precision}"):       # validate's check before measuring
        check_job_plan(plan, None, plan.model)


@pytest.mark.parametrize("change,message", [
    ({"recompute": True}, "recompute: the executor keeps every activation"),
    ({"optimizer_state_copies": 2}, "optimizer_state_copies 2: the executor trains a named optimizer"),
])
def test_what_the_executor_does_not_train_as_planned_is_refused_before_any_rank_starts(change, message):
    from dataclasses import replace
    from hetsim.plan import load_plan
    plan = replace(load_plan(PLAN), **change)
    with pytest.raises(HetsimError, match=message):
        make_job(plan, "cpu_host")


def test_an_output_folder_that_cannot_be_written_is_refused_before_the_run(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(HetsimError, match=r"^out .*file.*: .*is a file, not a folder"):
        executor.launch(PLAN, "cpu_host", out=tmp_path / "file" / "out")
    done = subprocess.run([sys.executable, "-m", "executor", "--plan", PLAN, "--cluster", "cpu_host", "--out",
                           str(tmp_path / "file" / "out")], capture_output=True, text=True)
    assert done.returncode == 2 and "--out" in done.stderr and "RANK" not in done.stderr


def test_a_malformed_rank_environment_is_one_line():
    import os
    env = {**os.environ, "RANK": "abc", "WORLD_SIZE": "5"}
    done = subprocess.run([sys.executable, "-m", "executor", "--plan", PLAN, "--cluster", "cpu_host"],
                          capture_output=True, text=True, env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "executor: error: RANK='abc', WORLD_SIZE='5': expected whole numbers" in done.stderr


def test_the_learning_rate_defaults_to_the_plans_optimizers_and_the_report_says_which():
    from dataclasses import replace
    from executor.measure import _settings
    from hetsim.plan import load_plan
    plan = load_plan(PLAN)
    assert (ExecOptions().lr_for("adam"), ExecOptions().lr_for("momentum"), ExecOptions(lr=0.2).lr_for("adamw")) \
        == (1e-3, 0.05, 0.2)
    assert _settings(ExecOptions(), replace(plan, optimizer="adamw"), "gloo")["lr"] == 1e-3
    settings = _settings(ExecOptions(), plan, "gloo")
    assert (settings["optimizer"], settings["lr"], settings["momentum"]) == ("momentum", 0.05, 0.9)


def test_only_rank_0_checks_the_out_folder_it_alone_writes(tmp_path, monkeypatch, capsys):
    """torchrun starts every rank at once; concurrent checks (each makes and removes the folder) raced."""
    from executor.__main__ import main
    blocked = tmp_path / "a_file"
    blocked.write_text("")
    plan = Path(__file__).resolve().parents[2] / "experiments" / "validation" / "plans" / "wsp_2vw_example.json"
    args = ["--plan", str(plan), "--cluster", "cpu_host", "--ranks",
            "--out", str(blocked / "out")]
    monkeypatch.setenv("RANK", "1")
    assert main(args) == 0                           # not rank 0: no check (and it writes nothing)
    monkeypatch.setenv("RANK", "0")
    assert main(args) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_a_profile_of_another_model_or_without_the_plans_gpu_types_is_refused_before_any_rank_starts():
    """The executor's --profile orders a hetpipe schedule: it must be the trained model's, layer for
    layer (an mlp profile of 5 layers for a 9-layer model once failed on every rank with an IndexError)."""
    from dataclasses import replace
    from conftest import profile
    from hetsim.plan import load_plan
    plan = replace(load_plan(PLAN), schedule="hetpipe")
    from executor.launch import check_job_plan
    n = check_job_plan(plan, None, plan.model)
    with pytest.raises(HetsimError, match=rf"^profile: a profile of 'synthetic' \({n} layers\), but the job trains 'mlp'"):
        make_job(plan, "cpu_host", profile=profile(n, 0.01, 0.02, types=("cpu",)))
    mlp = lambda layers, types=("cpu",): replace(profile(layers, 0.01, 0.02, types=types), model="mlp")
    with pytest.raises(HetsimError, match=rf"^profile: a profile of 'mlp' \({n - 4} layers\), but the job trains "
                                          rf"'mlp' \({n} layers\)"):
        make_job(plan, "cpu_host", profile=mlp(n - 4))
    with pytest.raises(HetsimError, match="no layer times for GPU type 'cpu'"):
        make_job(plan, "cpu_host", profile=mlp(n, types=("v100",)))
    assert make_job(plan, "cpu_host", profile=mlp(n)).profile.n_layers == n


def test_an_output_folder_whose_report_file_names_are_folders_is_refused_before_the_run(tmp_path):
    (tmp_path / "out" / "trace.json").mkdir(parents=True)
    with pytest.raises(HetsimError, match=r"^out .*out: trace.json there is a folder"):
        executor.launch(PLAN, "cpu_host", out=tmp_path / "out")


def test_the_layout_is_counted_without_allocating_the_models_weights(monkeypatch):
    import importlib
    import modelzoo
    launch = importlib.import_module("executor.launch")      # the module; executor.launch is its function
    job = make_job(PLAN, "cpu_host", model_kwargs={"hidden": 200_000})     # 160 GB of FP32 weights
    devices, build = [], modelzoo.build
    monkeypatch.setattr(launch.modelzoo, "build",
                        lambda *a, **k: devices.append(k.get("device")) or build(*a, **k))
    assert launch.layout_of(job).world_size == 5 and devices == ["meta"]


def test_a_seed_beyond_the_data_generators_own_range_still_makes_data():
    from executor.data import SyntheticData
    from modelzoo.tasks import task_of
    import modelzoo
    model, example = modelzoo.build("mlp", batch=1)
    data = SyntheticData(task=task_of(model, example), mode="teacher", seed=2**63 - 1, batch=4)
    assert data.inputs(1, 3).shape[0] == 4
