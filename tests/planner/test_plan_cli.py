"""`hetsim plan`: a ranked table, a plan file that `hetsim simulate` runs, one-line errors."""

import json

import pytest

import hetsim
from conftest import PIPEDREAM_PROFILES
from hetsim.cli import main
from hetsim.plan import load_plan


def test_plan_prints_a_ranking_and_writes_a_plan_that_simulates(capsys, tmp_path):
    out = tmp_path / "plan.json"
    assert main(["plan", "--cluster", "hetpipe_4node", "--model", "vgg19_b32_analytic", "--nm", "2,4",
                 "--top", "2", "--margin", "0", "--waves", "6", "--jobs", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "policy" in text and "samples/s" in text and "bottleneck" in text and "staleness" in text
    rank1 = next(line for line in text.splitlines() if line.strip().startswith("1 "))
    plan = load_plan(out)
    assert plan.name.startswith(rank1.split()[1].lower())
    assert plan.minibatch_size == 32 and plan.sync.mode == "wsp"
    assert main(["simulate", "--cluster", "hetpipe_4node", "--profile", "vgg19_b32_analytic",
                 "--plan", str(out), "--waves", "6", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["throughput"]["samples_per_s"] > 0


@pytest.mark.parametrize("args, message", [
    (["--policies", "NP,XX"], "policy 'XX': choose from NP, ED, HD, auto, horovod"),
    (["--nm", "two"], "--nm 'two': expected comma-separated integers"),
    (["--batch", "0"], "--batch: must be >= 1"),
    (["--batch", "4096", "--policies", "NP"], "does not fit"),
])
def test_bad_plan_requests_are_one_line_errors(capsys, args, message):
    code = main(["plan", "--cluster", "hetpipe_4node", "--model", "vgg19_b32_analytic", "--jobs", "1", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_a_profile_without_times_for_some_cluster_gpus_is_named(capsys):
    code = main(["plan", "--cluster", "hetpipe_4node", "--model", str(PIPEDREAM_PROFILES / "vgg16.txt"),
                 "--graph-gpu", "titan-v", "--jobs", "1"])
    assert code == 2
    assert ("no layer times for GPU type(s) quadro-p4000, rtx-2060, titan-rtx of cluster hetpipe_4node"
            in capsys.readouterr().err)


def _plan(capsys, *args: str) -> tuple[int, str]:
    code = main(["plan", "--cluster", "hetpipe_4node", "--model", "vgg19_b32_analytic", "--nm", "4", "--top", "2",
                 "--margin", "0", "--waves", "8", "--jobs", "1", "--quiet", *args])
    return code, capsys.readouterr().out


def test_the_ranking_explains_every_policy_name_it_shows_in_one_line(capsys):
    code, text = _plan(capsys, "--policies", "auto,horovod", "--show", "100")
    assert code == 0
    legend = [line for line in text.splitlines() if line.startswith("policy: ")]
    assert len(legend) == 1
    shown = {line.split()[1] for line in text.splitlines() if line[:3].strip().isdigit()}
    for name in shown:                     # e.g. NP/2-node3: NP/k and -NODE are both explained
        head = name.split("-")[0]
        assert (head.split("/")[0] + "/" if "/" in head else head) in legend[0], name
        assert "-" not in name or "-NODE" in legend[0]


def test_sync_bsp_searches_flush_schedules_and_writes_a_bsp_plan(capsys, tmp_path):
    code, text = _plan(capsys, "--sync", "bsp", "--policies", "ED", "--out", str(tmp_path / "bsp.json"))
    plan = load_plan(tmp_path / "bsp.json")
    assert code == 0 and plan.sync.mode == "bsp" and plan.schedule == "1f1b-flush"
    assert "what if: sync bsp" in text


def test_a_slowed_node_is_planned_as_slower_gpus_and_the_plan_simulates_with_it(capsys, tmp_path):
    code, plain = _plan(capsys, "--policies", "ED")
    code_slow, slow = _plan(capsys, "--policies", "ED", "--slowdown", "node1=2", "--out", str(tmp_path / "p.json"))
    assert code == code_slow == 0 and "titan-rtx(x2)" in slow and "titan-rtx(x2)" not in plain
    def rate(text: str) -> float:                # rank 1's simulated samples/s
        return float(next(l for l in text.splitlines() if l.strip().startswith("1 ")).split("*")[0].split()[-1])
    assert rate(slow) < rate(plain)
    assert "--slowdown node1=2" in slow
    capsys.readouterr()
    # The command it prints, at the planner's waves, gives rank 1's figure: the hetpipe order is
    # shaped by the slowed costs in both (simulate shaped it by the nominal ones, 443.0 against 470.3).
    assert main(["simulate", "--cluster", "hetpipe_4node", "--profile", "vgg19_b32_analytic", "--plan",
                 str(tmp_path / "p.json"), "--slowdown", "node1=2", "--waves", "8", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)["throughput"]["samples_per_s"]
    assert again == pytest.approx(rate(slow), abs=0.05)


def test_one_slowed_gpu_of_a_node_gets_less_work_from_the_partitioner(capsys, tmp_path):
    profile = hetsim.load_profile("vgg19_b32_analytic")

    def share(*slowdown: str) -> float:          # node1/gpu0's part of its VW's compute seconds
        assert _plan(capsys, "--policies", "NP", *slowdown, "--out", str(tmp_path / "np.json"))[0] == 0
        stages = next(vw.stages for vw in load_plan(tmp_path / "np.json").virtual_workers
                      if vw.stages[0].gpu.startswith("node1/"))
        seconds = {s.gpu: sum(profile.stage_times("titan-rtx", *s.layers)) for s in stages}
        return seconds["node1/gpu0"] / sum(seconds.values())

    assert share("--slowdown", "node1/gpu0=3") < share() / 2


@pytest.mark.parametrize("args, message", [
    (["--sync", "bsp", "--schedule", "hetpipe"], "--sync bsp: needs a flush schedule (--schedule gpipe, 1f1b-flush, "
                                                 "1f1b-interleaved, zb-h1, 1f1b-deepspeed), not hetpipe"),
    (["--tp", "1,2", "--sync", "bsp", "--schedule", "zb-h1"],
     "--tp 1,2: --schedule zb-h1 runs stages of one GPU each; give --tp 1 or another schedule"),
    (["--schedule", "1f1b-deepspeed"], "--schedule 1f1b-deepspeed: runs with --sync bsp, not --sync wsp"),
    (["--schedule", "zb-h1", "--sync", "sdpipe"], "--schedule zb-h1: runs with --sync bsp, not --sync sdpipe"),
    (["--slowdown", "node9=2"], "--slowdown 'node9=2': cluster hetpipe_4node has no GPU or node 'node9'"),
    (["--slowdown", "node1=0"], "--slowdown 'node1=0': expected"),
])
def test_bad_what_if_options_are_one_line_errors(capsys, args, message):
    code = main(["plan", "--cluster", "hetpipe_4node", "--model", "vgg19_b32_analytic", "--jobs", "1", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_the_ranking_is_the_same_on_a_running_dask_cluster(capsys):
    from distributed import LocalCluster
    args = ["--policies", "auto", "--nm", "2,4", "--top", "3", "--show", "8"]
    code, inline = _plan(capsys, *args)
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster:
        code_remote, remote = _plan(capsys, *args, "--scheduler", cluster.scheduler_address)
    assert code == code_remote == 0
    assert remote.splitlines()[1:] == inline.splitlines()[1:]      # all but the line with the time taken


def test_tp_option_writes_a_tensor_parallel_plan_that_simulates(capsys, tmp_path):
    code, text = _plan(capsys, "--tp", "2", "--sync", "bsp", "--policies", "ED", "--out", str(tmp_path / "tp.json"))
    plan = load_plan(tmp_path / "tp.json")
    assert code == 0 and "ED+TP2" in text and "+TPt:" in text
    assert all(s.tp == 2 for vw in plan.virtual_workers for s in vw.stages)
    assert main(["simulate", "--cluster", "hetpipe_4node", "--profile", "vgg19_b32_analytic",
                 "--plan", str(tmp_path / "tp.json"), "--waves", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["throughput"]["samples_per_s"] > 0


def test_a_tp_degree_below_one_is_a_one_line_error(capsys):
    code = main(["plan", "--cluster", "hetpipe_4node", "--model", "vgg19_b32_analytic", "--jobs", "1", "--tp", "1,0"])
    err = capsys.readouterr().err
    assert code == 2 and "--tp '1,0': every value must be >= 1" in err and len(err.strip().splitlines()) == 1


def test_the_rankings_columns_widen_for_a_virtual_worker_of_sixteen_stages(capsys):
    """ED on 16 nodes makes 16-stage VWs: the partition and memory cells outgrow their default widths,
    and the columns widen so that every row stays as long as the header (none runs into the next)."""
    assert main(["plan", "--cluster", "sdpipe_16x4", "--model", "resnet18_b32", "--policies", "ED", "--nm", "16",
                 "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("# policy"))
    rows = [line for line in lines[header + 2:] if line[:3].strip().isdigit()]
    assert rows and len(lines[header]) > 180 and all(len(r) == len(lines[header]) for r in rows)
    assert "v100:44-69  16" in rows[0]
