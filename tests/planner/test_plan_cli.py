"""`hetsim plan`: a ranked table, a plan file that `hetsim simulate` runs, one-line errors."""

import json

import pytest

from conftest import PIPEDREAM_PROFILES, needs_pipedream_profiles
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


@needs_pipedream_profiles()
def test_a_profile_without_times_for_some_cluster_gpus_is_named(capsys):
    code = main(["plan", "--cluster", "hetpipe_4node", "--model", str(PIPEDREAM_PROFILES / "vgg16.txt"),
                 "--graph-gpu", "titan-v", "--jobs", "1"])
    assert code == 2
    assert ("no layer times for GPU type(s) quadro-p4000, rtx-2060, titan-rtx of cluster hetpipe_4node"
            in capsys.readouterr().err)
