"""The command line: the built-in example runs, and bad input is one line and a non-zero exit."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

import hetsim
from conftest import TINY_CLUSTER_YAML as CLUSTER
from hetsim.cli import main
from hetsim.data import data_root, resolve
from hetsim.errors import PlanError

PLAN = {"name": "p", "minibatch_size": 32, "nm": 2, "schedule": "hetpipe", "sync": {"mode": "none"},
        "virtual_workers": [{"name": "vw0", "stages": [{"gpu": "node0/gpu0", "layers": [0, 20]},
                                                       {"gpu": "node0/gpu1", "layers": [20, 44]}]}]}


def run_cli(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_no_arguments_simulates_the_builtin_example(capsys):
    code, out, err = run_cli(capsys)
    assert code == 0 and err == ""
    assert "throughput:" in out and "hetpipe_vgg19_ed" in out and "node3/gpu3" in out


def test_options_without_a_subcommand_mean_simulate(capsys):
    code, out, _ = run_cli(capsys, "--waves", "4", "--seed", "2")
    assert code == 0 and "throughput:" in out


def test_sdpipe_groups_are_summarised_in_the_text_report(capsys, tmp_path):
    plan = dict(PLAN, nm=1, virtual_workers=[{"name": "vw0", "stages": [{"gpu": "node0/gpu0", "layers": [0, 44]}]},
                                       {"name": "vw1", "stages": [{"gpu": "node0/gpu1", "layers": [0, 44]}]}],
                schedule="gpipe", sync={"mode": "sdpipe", "sdpipe_period": 1})
    (tmp_path / "c.yaml").write_text(CLUSTER)
    (tmp_path / "p.json").write_text(json.dumps(plan))
    code, out, _ = run_cli(capsys, "simulate", "--cluster", str(tmp_path / "c.yaml"), "--profile",
                           "vgg19_b32_analytic", "--plan", str(tmp_path / "p.json"), "--waves", "6")
    # Period 1 is plain all-reduce: every wave one group of both pipelines, which connects them.
    assert code == 0
    assert "sdpipe groups (period 1): 6 formed, mean size 2.00 (size 2: 6); all pipelines connected 6 times" in out


def test_the_text_report_names_busy_links_only_where_the_report_has_some(tmp_path):
    import dataclasses

    from hetsim.cli.simulate import format_report
    from hetsim.plan import plan_from_dict
    (tmp_path / "c.yaml").write_text(CLUSTER)
    report = hetsim.simulate(str(tmp_path / "c.yaml"), "vgg19_b32_analytic", plan_from_dict(dict(PLAN, nm=1)), waves=4)
    assert "busiest links: " in format_report(report)
    # A measurement (the executor's report) records no link utilisation: no empty line for it.
    assert "busiest links" not in format_report(dataclasses.replace(report, links=[]))


def test_out_writes_report_tables_trace_and_figures(capsys, tmp_path):
    code, out, _ = run_cli(capsys, "simulate", "--waves", "4", "--out", str(tmp_path))
    assert code == 0
    names = {p.name for p in tmp_path.iterdir()}
    assert {"report.json", "gpus.csv", "links.csv", "staleness_global.csv", "trace.json",
            "timeline.png", "utilisation.png"} <= names
    trace = json.loads((tmp_path / "trace.json").read_text())
    rows = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    assert len(rows) == 16


def test_json_output_is_the_report(capsys):
    code, out, _ = run_cli(capsys, "simulate", "--waves", "4", "--json")
    assert code == 0 and json.loads(out)["kind"] == "prediction"


def write_inputs(tmp_path, cluster=CLUSTER, plan=PLAN):
    (tmp_path / "c.yaml").write_text(cluster)
    (tmp_path / "p.json").write_text(json.dumps(plan))
    return ["simulate", "--cluster", str(tmp_path / "c.yaml"), "--plan", str(tmp_path / "p.json")]


def with_stage(gpu=None, nm=None):
    """PLAN with stage 1 moved to another GPU, or another Nm (PLAN's Nm=2 needs 6.6 GiB > 6)."""
    doc = json.loads(json.dumps(PLAN))
    if gpu:
        doc["virtual_workers"][0]["stages"][1]["gpu"] = gpu
    if nm:
        doc["nm"] = nm
    return doc


@pytest.mark.parametrize("cluster,plan,message", [
    (CLUSTER.replace("network: {kind: ethernet, bandwidth_gbit_s: 10}\n", ""), PLAN,
     "c.yaml: network: missing"),
    (CLUSTER.replace("bandwidth_gbit_s: 10", "bandwidth_gbit_s: -1"), PLAN,
     "c.yaml: network.bandwidth_gbit_s: must be > 0, got -1"),
    (CLUSTER.replace("rtx-2060", "rtx-9090"), PLAN, "c.yaml: nodes[0].gpus[0].type: unknown GPU type 'rtx-9090'"),
    (CLUSTER, with_stage(gpu="node1/gpu0"),
     "p.json: virtual_workers[0].stages[1].gpu: vw0 stage 1: cluster tiny: no GPU 'node1/gpu0'"),
    (CLUSTER, with_stage(nm=8), "p.json: stage 0 of vw0 on node0/gpu0 (NVIDIA GeForce RTX 2060, 6.0 GiB) needs"),
])
def test_bad_input_is_one_line_and_a_nonzero_exit(capsys, tmp_path, cluster, plan, message):
    code, out, err = run_cli(capsys, *write_inputs(tmp_path, cluster, plan))
    assert code == 2 and out == ""
    assert err.startswith(f"hetsim: error: {message}")
    assert err.count("\n") == 1 and "Traceback" not in err


def test_bad_input_in_a_real_process_prints_no_traceback(tmp_path):
    args = write_inputs(tmp_path, CLUSTER.replace("rtx-2060", "rtx-9090"))
    proc = subprocess.run([sys.executable, "-m", "hetsim", *args], capture_output=True, text=True)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


def test_bad_option_values_are_reported(capsys):
    code, _, err = run_cli(capsys, "simulate", "--slowdown", "node0/gpu0=fast")
    assert code == 2 and "--slowdown 'node0/gpu0=fast'" in err
    code, _, err = run_cli(capsys, "simulate", "--waves", "2", "--warmup-waves", "2")
    assert code == 2 and "--warmup-waves 2: must be less than --waves (2)" in err


def test_a_pipedream_graph_profile_simulates_on_the_gpu_type_it_was_measured_on(capsys, tmp_path):
    from hetsim.pipedream_graph import write_graph
    from hetsim.profile_files import load_profile
    write_graph(load_profile("vgg19_b32_analytic"), tmp_path / "vgg19.txt", gpu_type="rtx-2060")
    args = write_inputs(tmp_path, plan=with_stage(nm=1))
    code, out, err = run_cli(capsys, *args, "--profile", str(tmp_path / "vgg19.txt"),
                             "--graph-gpu", "rtx-2060", "--graph-batch", "32", "--waves", "4")
    assert code == 0, err
    assert "throughput:" in out and "graph.txt vgg19.txt" in out


# Issue 18: every bad input gets one clear answer; extreme but valid inputs run (or are refused clearly).

def one_line_error(code, out, err, *names):
    assert code == 2 and out == "" and "Traceback" not in err and err.count("\n") == 1, err
    assert all(name in err for name in names), err


def test_a_wsp_plan_on_a_cluster_listing_no_parameter_servers_is_refused(capsys, tmp_path):
    cluster = (data_root() / "clusters" / "hetpipe_4node.yaml").read_text()
    (tmp_path / "c.yaml").write_text(cluster.replace("parameter_servers: [node0, node1, node2, node3]",
                                                     "parameter_servers: []"))
    one_line_error(*run_cli(capsys, "simulate", "--cluster", str(tmp_path / "c.yaml")), "c.yaml: parameter_servers:")


def test_a_wsp_plan_on_a_cluster_object_without_parameter_servers_is_refused():
    from dataclasses import replace
    cluster = replace(hetsim.load_cluster("hetpipe_4node"), ps_nodes=())
    with pytest.raises(PlanError, match="parameter_servers"):
        hetsim.simulate(cluster, waves=2, warmup_waves=1)


def test_plan_refuses_zero_jobs(capsys):
    one_line_error(*run_cli(capsys, "plan", "--cluster", "hetpipe_4node", "--model", "vgg19_b32_analytic",
                            "--jobs", "0"), "--jobs", "must be >= 1")


def test_an_output_folder_that_cannot_be_made_is_refused_before_simulating(capsys, tmp_path):
    (tmp_path / "file").write_text("")
    code, out, err = run_cli(capsys, "simulate", "--out", str(tmp_path / "file" / "out"))
    one_line_error(code, out, err, "--out", "is a file, not a folder")


def test_a_folder_where_a_report_file_goes_is_one_line_and_nothing_is_written(capsys, tmp_path):
    (tmp_path / "report.json").write_text("an earlier report")
    (tmp_path / "timeline.png").mkdir()
    code, _, err = run_cli(capsys, "simulate", "--waves", "3", "--out", str(tmp_path))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "timeline.png there is a folder" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "timeline.png"]
    assert (tmp_path / "report.json").read_text() == "an earlier report"


def test_plan_and_profile_make_their_output_files_folders(capsys, tmp_path):
    assert run_cli(capsys, "plan", "--cluster", "hetpipe_4node", "--model", "vgg19_b32_analytic", "--jobs", "1",
                   "--quiet", "--out", str(tmp_path / "a" / "b" / "plan.json"))[0] == 0
    assert run_cli(capsys, "profile", "--model", "mlp", "--batch", "4", "--no-measure", "--derive-for", "v100",
                   "--out", str(tmp_path / "c" / "p.yaml"))[0] == 0
    assert (tmp_path / "a" / "b" / "plan.json").stat().st_size and (tmp_path / "c" / "p.yaml").stat().st_size


def test_plan_writes_the_precision_optimizer_and_recomputation_it_planned_for(capsys, tmp_path):
    out = tmp_path / "plan.json"
    code, text, err = run_cli(capsys, "plan", "--cluster", "hetpipe_4node", "--model", "vgg19_b32_analytic",
                              "--jobs", "1", "--quiet", "--nm", "2", "--precision", "bf16", "--optimizer", "adam",
                              "--recompute", "--out", str(out))
    assert code == 0 and "(minibatch 32, bf16, adam, recompute)" in text, err
    written = json.loads(out.read_text())
    assert (written["precision"], written["optimizer"], written["recompute"]) == ("bf16", "adam", True)
    one_line_error(*run_cli(capsys, "plan", "--cluster", "hetpipe_4node", "--model", "vgg19_b32_analytic",
                            "--optimizer", "lamb"), "--optimizer", "lamb")


def test_profile_refuses_an_unknown_device_in_one_line(capsys, tmp_path):
    one_line_error(*run_cli(capsys, "profile", "--model", "mlp", "--device", "tpu", "--out", str(tmp_path / "p.yaml")),
                   "--device tpu: expected cpu, cuda or cuda:N")


def test_one_wave_without_warm_up_runs(capsys):
    code, out, err = run_cli(capsys, "simulate", "--waves", "1", "--warmup-waves", "0")
    assert code == 0 and "throughput:" in out, err
    code, out, err = run_cli(capsys, "simulate", "--waves", "1")          # the warm-up shrinks to fit
    assert code == 0 and "throughput:" in out, err


def test_a_straggler_sleeping_a_million_seconds_returns(capsys):
    code, out, err = run_cli(capsys, "simulate", "--straggler", "1:1e6", "--waves", "3")
    assert code == 0 and "throughput:" in out, err


def test_json_with_out_prints_exactly_the_report_on_stdout(capsys, tmp_path):
    code, out, err = run_cli(capsys, "simulate", "--waves", "3", "--json", "--out", str(tmp_path), "--no-plots")
    assert code == 0 and json.loads(out) == json.loads((tmp_path / "report.json").read_text())
    assert "wrote" in err


def test_a_million_minibatches_are_refused_clearly_not_simulated_for_hours(capsys):
    one_line_error(*run_cli(capsys, "simulate", "--waves", "250000"), "--waves", "stage-minibatches", "simulate fewer")


def test_an_extreme_slowdown_or_jitter_runs_or_asks_for_more_waves(capsys):
    code, out, err = run_cli(capsys, "simulate", "--slowdown", "node0/gpu0=1e6", "--waves", "6")
    assert code == 0 and "throughput:" in out, err
    one_line_error(*run_cli(capsys, "simulate", "--jitter", "10", "--waves", "2"), "no steady-state window",
                   "simulate more waves")


def test_a_one_gpu_cluster_simulates_and_plans(capsys, tmp_path):
    cluster = CLUSTER.replace("count: 2", "count: 1")
    plan = dict(PLAN, nm=1, schedule="gpipe", virtual_workers=[
        {"name": "vw0", "stages": [{"gpu": "node0/gpu0", "layers": [0, 44]}]}])
    args = write_inputs(tmp_path, cluster, plan)
    code, out, err = run_cli(capsys, *args, "--profile", "vgg19_b32_analytic", "--waves", "3")
    assert code == 0 and "throughput:" in out, err
    code, out, err = run_cli(capsys, "plan", "--cluster", str(tmp_path / "c.yaml"), "--model", "vgg19_b32_analytic",
                             "--jobs", "1", "--waves", "3", "--nm", "1", "--batch", "8")
    assert code == 0 and "titan" not in out and "rtx-2060:0-44" in out, err


def test_a_plan_of_another_model_is_refused(capsys, tmp_path):
    args = write_inputs(tmp_path, plan=dict(PLAN, model="resnet50"))
    one_line_error(*run_cli(capsys, *args, "--profile", "vgg19_b32_analytic"), "p.json: model: 'resnet50'", "vgg19")


def test_a_closed_pipe_on_stdout_ends_quietly():
    proc = subprocess.run(f"{sys.executable} -m hetsim --waves 2 | head -c 10", shell=True, capture_output=True,
                          text=True)
    assert "Traceback" not in proc.stderr and proc.stdout == "prediction"


def test_a_name_given_twice_in_repeated_assignments_is_one_line(capsys):
    one_line_error(*run_cli(capsys, "simulate", "--slowdown", "node2=2", "--slowdown", "node2=3"),
                   "--slowdown 'node2=3'", "node2 is given twice")


@pytest.mark.parametrize("word, hint", [("compare", ""), ("simulat", "did you mean 'simulate'?")])
def test_an_unknown_command_is_one_line_even_with_help(capsys, word, hint):
    one_line_error(*run_cli(capsys, word, "--help"), f"unknown command {word!r}", hint)


def test_a_plan_naming_a_gpu_the_cluster_lacks_or_an_unknown_model_is_told_at_its_field(capsys, tmp_path):
    doc = json.loads(resolve("plan", "hetpipe_vgg19_ed").read_text())
    doc["virtual_workers"][1]["stages"][0]["gpu"] = "node9/gpu0"
    (tmp_path / "p.json").write_text(json.dumps(doc))
    one_line_error(*run_cli(capsys, "simulate", "--plan", str(tmp_path / "p.json")),
                   "p.json: virtual_workers[1].stages[0].gpu: vw1 stage 0: cluster hetpipe_4node: no GPU 'node9/gpu0'")
    doc["virtual_workers"][1]["stages"][0] = {"gpus": ["node1/gpu1", "node1/gpu9"], "layers": [0, 14]}
    (tmp_path / "p.json").write_text(json.dumps(doc))
    one_line_error(*run_cli(capsys, "simulate", "--plan", str(tmp_path / "p.json")),
                   "p.json: virtual_workers[1].stages[0].gpus[1]: vw1 stage 0: cluster hetpipe_4node: no GPU 'node1/gpu9'")
    doc = json.loads((Path(__file__).resolve().parents[1] / "experiments" / "validation" / "plans"
                      / "wsp_2vw_mlp1024.json").read_text())
    (tmp_path / "v.json").write_text(json.dumps({**doc, "model": "mlpx"}))
    one_line_error(*run_cli(capsys, "validate", "--plan", str(tmp_path / "v.json")),
                   "v.json: model: unknown model 'mlpx'; did you mean 'mlp'?")


def test_the_command_plan_prints_reproduces_its_rank_1_with_the_searchs_settings(tmp_path, capsys):
    """The printed simulate command carries --waves, --jitter and --seed (simulate's defaults differ)."""
    import re
    import shlex
    out = tmp_path / "my plans" / "p 1.json"         # printed quoted, so that it pastes
    out.parent.mkdir()
    assert main(["plan", "--cluster", "hetpipe_4node", "--model", "vgg19_b32_analytic", "--show", "1",
                 "--waves", "6", "--jitter", "0.05", "--seed", "3", "--policies", "ED", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    ranked = float(re.search(r"(\d+\.\d)\*", printed).group(1))
    command = re.search(r"run it with `hetsim (simulate [^`]+)`", printed).group(1)
    assert "--waves 6" in command and "--jitter 0.05" in command and "--seed 3" in command
    assert main(shlex.split(command) + ["--json"]) == 0
    again = json.loads(capsys.readouterr().out)["throughput"]["samples_per_s"]
    assert round(again, 1) == ranked


def test_a_cluster_above_the_simulation_limit_is_ranked_by_estimate_and_says_so(capsys):
    code, out, _ = run_cli(capsys, "plan", "--cluster", "hetpipe_4node", "--model", "vgg19_b32_analytic",
                           "--policies", "ED", "--sim-max-gpus", "4")
    assert code == 0 and " 0 simulated" in out and "*" not in out.split("\n\n")[1]
    assert "note: no candidate simulated: the cluster's 16 GPUs are more than --sim-max-gpus 4" in out
    code, out, _ = run_cli(capsys, "plan", "--cluster", "hetpipe_4node", "--model", "vgg19_b32_analytic",
                           "--policies", "ED", "--top", "1")
    assert code == 0 and "no candidate simulated" not in out and " 0 simulated" not in out


def test_the_command_plan_prints_for_a_graph_txt_names_its_gpu_type_and_batch(tmp_path, capsys):
    import re
    import shlex
    from hetsim.pipedream_graph import write_graph
    from conftest import profile
    write_graph(profile(12, 0.002, 0.004, types=("cpu",)), tmp_path / "graph.txt", gpu_type="cpu")
    assert main(["plan", "--cluster", "cpu_host", "--model", str(tmp_path / "graph.txt"), "--graph-gpu", "cpu",
                 "--graph-batch", "8", "--jobs", "1", "--waves", "4", "--nm", "1", "--policies", "NP",
                 "--out", str(tmp_path / "p.json")]) == 0
    command = re.search(r"run it with `hetsim (simulate [^`]+)`", capsys.readouterr().out).group(1)
    assert "--graph-gpu cpu --graph-batch 8" in command
    assert main(shlex.split(command) + ["--json"]) == 0


def test_the_window_is_printed_in_hundredths_or_in_e_notation_when_extreme():
    from hetsim.cli.simulate import _window_s
    assert (_window_s(16.876), _window_s(0.09), _window_s(7e296), _window_s(1.234e-4)) == ("16.88", "0.09", "7e+296",
                                                                                            "0.000123")
