"""Importing Sailor's real-GPU runs, and the accuracy hetsim reaches on them (experiments/peers/sailor)."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

import hetsim
from hetsim.cli import main
from hetsim.cluster import load_cluster
from hetsim.errors import SpecError
from hetsim.plan import load_plan
from hetsim.sailor import import_run

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "experiments" / "peers" / "sailor" / "data"
OPT = DATA / "configs" / "training_config_opt_350.json"
GH = DATA / "plans" / "gh200-opt350"
MIT = DATA / "plans" / "mit-opt350"


def imported(tmp_path, plan, *extra):
    out = tmp_path / plan.stem
    assert main(["import", "sailor", str(plan), "--data", str(DATA), "--training-config", str(OPT),
                 "--out", str(out), *extra]) == 0
    return out


def test_an_import_writes_its_four_files_together_or_none(tmp_path, capsys):
    (tmp_path / "out" / "profile.yaml").mkdir(parents=True)
    code = main(["import", "sailor", str(GH / "plan_config_N4_D2.json"), "--data", str(DATA), "--training-config",
                 str(OPT), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "profile.yaml there is a folder" in err
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["profile.yaml"]


def test_a_gh200_plan_becomes_replicas_of_tp4_groups_on_per_gpu_network_rails(tmp_path):
    out = imported(tmp_path, GH / "plan_config_N4_D2.json")
    plan, cluster = load_plan(out / "plan.json"), load_cluster(out / "cluster.yaml")
    assert (len(plan.virtual_workers), plan.nm, plan.sync.mode, plan.schedule) == (2, 32, "bsp", "1f1b-deepspeed")
    assert [s.tp for s in plan.virtual_workers[0].stages] == [4, 4]
    assert [s.layers for s in plan.virtual_workers[1].stages] == [(0, 12), (12, 26)]
    assert len(cluster.nodes) == 4 and all(n.nic_per_gpu for n in cluster.nodes)
    report = hetsim.simulate(cluster, hetsim.load_profile(out / "profile.yaml"), plan, waves=3,
                             warmup_waves=1, trace=False)
    assert report.throughput["tokens_per_s"] == report.throughput["samples_per_s"] * 2048
    assert {g.tp for g in report.gpus} == {4} and len(report.gpus) == 16


def test_mixed_replicas_and_a_slow_path_between_nodes(tmp_path):
    out = imported(tmp_path, MIT / "plan_config_N4_D2.json")
    plan, cluster = load_plan(out / "plan.json"), load_cluster(out / "cluster.yaml")
    types = [[cluster.gpu(s.gpu).type.name for s in vw.stages] for vw in plan.virtual_workers]
    assert types == [["rtx-3090", "titan-rtx"], ["rtx-2080-ti", "rtx-2080-ti"]]
    assert cluster.paths, "Sailor measured 115 MB/s between some nodes whose interfaces are faster"


def test_a_plan_for_another_model_and_mixed_datacentre_gpus_imports_from_the_same_files(tmp_path):
    """Nothing is particular to OPT-350 or to the shipped plans: a GPT-Neo-2.7 plan written in Sailor's
    format (replicas on GH200 and A100 40 GB, TP 4) takes Sailor's GPT-Neo layer times and its shape
    from the training config."""
    neo = DATA / "configs" / "training_config_gpt_neo27.json"
    stage = lambda: [[[["GH-96", 4, "us-central1-a"]], 4], [[["A100-40", 4, "us-central1-a"]], 4]]
    plan = {"zone": "us-central1-a", "mbs": 1, "gbs": 64, "real": 5.0, "max_mem": 30_000_000_000, "N": 4,
            "pipeline_list": [{"num_stages": 2, "layers_per_stage": [list(range(17)), list(range(17, 34))],
                               "tmp_per_stage": [stage(), stage()], "dp": [2, 2]}]}
    path = tmp_path / "plan_config_neo.json"
    path.write_text(json.dumps(plan))
    run = import_run(path, DATA, neo)
    times = json.loads((DATA / "profiles_tmp.json").read_text())["GPT-Neo-2.7"]
    assert len(run.profile.layers) == 34
    block = run.profile.layers[5]
    assert block.param_bytes == pytest.approx(4 * 12 * 2560 ** 2, rel=0.01)
    for i in (0, 1, 5, 33):       # the embedding, the head and a block take different times
        layer, key = run.profile.layers[i], str(i)
        assert layer.fwd_s["gh200@tp4"] == times["GH-96"]["1"]["4"][key][0]
        assert layer.bwd_s["a100@tp4"] == times["A100-40"]["1"]["4"][key][1]
    out = tmp_path / "neo"
    assert main(["import", "sailor", str(path), "--data", str(DATA), "--training-config", str(neo),
                 "--out", str(out)]) == 0
    cluster = load_cluster(out / "cluster.yaml")
    report = hetsim.simulate(cluster, hetsim.load_profile(out / "profile.yaml"), load_plan(out / "plan.json"),
                             waves=3, warmup_waves=1, trace=False)
    assert {g.type for g in report.gpus} == {"gh200", "a100"} and len(report.gpus) == 16
    assert report.throughput["tokens_per_s"] == report.throughput["samples_per_s"] * 2048


def test_sailors_whole_model_optimizer_step_is_spread_over_the_layers_by_their_parameters(tmp_path):
    """Sailor's third column carries the same figure in every layer (the whole model's step on one TP
    member); summed over the imported layers it is that figure once, and the 54 M-parameter embedding
    takes about four blocks' share."""
    table = json.loads((DATA / "profiles_tmp.json").read_text())["OPT-350"]["GH-96"]["4"]["4"]
    whole = table["0"][2]
    assert {row[2] for row in table.values()} == {whole}
    profile = import_run(GH / "plan_config_N4_D4.json", DATA, OPT).profile
    updates = [l.update_s["gh200@tp4"] for l in profile.layers]
    assert sum(updates) == pytest.approx(whole, rel=1e-9)
    block, embedding = updates[5], updates[0]
    assert embedding / block == pytest.approx(profile.layers[0].param_bytes / profile.layers[5].param_bytes)
    assert 3.5 < embedding / block < 4.5


def test_a_per_layer_optimizer_step_column_is_kept_per_layer():
    from hetsim.sailor import _layer_updates
    assert _layer_updates([1.0, 2.0, 3.0], [10, 10, 20]) == [1.0, 2.0, 3.0]
    assert _layer_updates([3.0, 3.0, 3.0], [10, 10, 40]) == [0.5, 0.5, 2.0]


def test_a_micro_batch_without_measured_times_is_named(tmp_path):
    doc = json.loads((GH / "plan_config_N4_D2.json").read_text())
    doc["mbs"] = 3
    bad = tmp_path / "plan_config_bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(SpecError, match="micro-batch 3, tensor-parallel 4.*--derived"):
        import_run(bad, DATA, OPT)


def test_a_malformed_replica_is_named(tmp_path):
    doc = json.loads((GH / "plan_config_N4_D2.json").read_text())
    doc["pipeline_list"][0]["tmp_per_stage"][1][0] = ["GH-96", 4]
    bad = tmp_path / "plan_config_bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(SpecError, match=r"tmp_per_stage\[1\]\[0\]"):
        import_run(bad, DATA, OPT)


def test_predictions_on_sailors_runs_stay_within_the_published_errors(tmp_path):
    """The accuracy experiments/peers/sailor/results reports; a change that loses it fails here."""
    out = tmp_path / "sailor.csv"
    subprocess.run([sys.executable, str(ROOT / "experiments" / "peers" / "sailor" / "run.py"), "--data", str(DATA),
                    "--training-config", str(OPT), "--plans", str(GH), str(MIT), "--out", str(out)],
                   check=True, capture_output=True)
    import pandas as pd
    rows = pd.read_csv(out)
    assert rows["error"].isna().all(), rows["error"].dropna().tolist()
    # (set, mean, max, Spearman): the mixed set's nine runs hold two near-ties (83.8 / 83.5 s, and the
    # two identical 59.5 s records), so its rank correlation is the looser of the two.
    for name, mean, worst, rho in (("gh200-opt350", 7.0, 16.5, 0.95), ("mit-opt350", 5.0, 9.0, 0.9)):
        one = rows[rows["set"] == name]
        errors = one["time_err_pct"].abs()
        assert len(errors) == {"gh200-opt350": 15, "mit-opt350": 9}[name]
        assert errors.mean() <= mean and errors.max() <= worst, (name, errors.mean(), errors.max())
        assert one["predicted_iter_s"].rank().corr(one["measured_iter_s"].rank()) >= rho, name
    gh = rows[rows["set"] == "gh200-opt350"]
    assert gh["mem_err_pct"].abs().mean() <= 6.0
    _gradient_reduction_matches_the_mixed_sets_red_grads(rows[rows["set"] == "mit-opt350"].set_index("plan"))
    # GH200: the reductions measured take longer than the per-GPU interface rate implies (README)
    replicated = gh[(gh["predicted_grad_reduce_s"] > 0) & (gh["plan"] != "plan_config_N4_D4")]
    ratio = replicated["measured_grad_reduce_s"] / replicated["predicted_grad_reduce_s"]
    assert len(ratio) == 10 and ratio.between(1.5, 10).all(), ratio.round(2).tolist()


def _gradient_reduction_matches_the_mixed_sets_red_grads(mit):
    """The all-reduce against the second quantity Sailor measured: rank 0's within 10 % (tested at 12)
    on the mixed set's replicated plans but N2_D2, whose measured figure is a waiting replica's (the
    longest span: its wait for the slower replica and the all-reduce); one replica per stage reduces
    nothing."""
    replicated = mit[mit["predicted_grad_reduce_s"] > 0]
    assert sorted(replicated.index) == [f"plan_config_{p}" for p in ("N2_D2", "N4_D2", "N4_D4", "N6_D2", "N6_D3",
                                                                      "N6_D6")]
    rank0 = replicated.drop(index="plan_config_N2_D2")["grad_reduce_err_pct"].abs()
    assert (rank0 <= 12.0).all(), rank0.to_dict()
    waiting = replicated.loc["plan_config_N2_D2"]
    assert abs(waiting["predicted_grad_reduce_max_s"] / waiting["measured_grad_reduce_s"] - 1) <= 0.05
    assert waiting["predicted_grad_reduce_s"] < 0.5 * waiting["predicted_grad_reduce_max_s"]


def test_the_planners_closed_form_agrees_with_the_simulator_on_tensor_parallel_plans(tmp_path):
    """Flush schedule: a wave is Nm minibatches through the bottleneck stage plus the pipeline's fill
    (bsp_estimate); on the GH200 plans with Nm >= 8 (one optimizer step is then a small part)."""
    from hetsim.planner.estimate import bsp_estimate, plan_partitions
    checked = 0
    for plan_path in sorted(GH.glob("*.json")):
        out = imported(tmp_path, plan_path)
        cluster, plan = load_cluster(out / "cluster.yaml"), load_plan(out / "plan.json")
        if plan.nm < 8 or len(plan.virtual_workers) > 1:
            continue
        profile = hetsim.load_profile(out / "profile.yaml")
        parts = plan_partitions(plan, cluster, profile)
        estimate = bsp_estimate(parts, plan.nm, 0, 1.0)
        simulated = hetsim.simulate(cluster, profile, plan, waves=3, warmup_waves=1, trace=False)
        assert plan.nm / estimate.minibatches_per_s == pytest.approx(simulated.throughput["iteration_s"], rel=0.03)
        checked += 1
    assert checked == 2          # N1_D1_M4_G32 and N4_D1


def test_derived_import_uses_no_measured_time_and_leaves_tp_all_reduces_to_the_simulator(tmp_path):
    out = imported(tmp_path, GH / "plan_config_N16_D8.json", "--derived")
    profile = hetsim.load_profile(out / "profile.yaml")
    assert not profile.tp_times_include_allreduce
    assert "gh200@tp4" in profile.layers[5].fwd_s and not profile.layers[5].update_s
    measured = json.loads((out / "measured.json").read_text())["iteration_s"]
    report = hetsim.simulate(out / "cluster.yaml", profile, out / "plan.json", waves=3, warmup_waves=1, trace=False)
    assert report.throughput["iteration_s"] == pytest.approx(measured, rel=0.2)


def test_a_derived_bf16_import_warns_about_the_gpus_without_bf16_units(tmp_path, capsys):
    imported(tmp_path, MIT / "plan_config_N3_D1.json", "--derived", "--precision", "bf16")
    err = capsys.readouterr().err
    assert "warning: bf16: rtx-2080-ti, titan-rtx have no BF16 units" in err and "rtx-3090" not in err


def test_derived_tp_ranks_take_the_efficiency_files_host_floor_and_single_gpus_do_not(tmp_path):
    """With a 50 ms GH200 floor in another efficiency file (`--efficiency` of run.py), every TP-4 block
    pass at micro-batch 1 takes exactly that; the same blocks on one GPU and the embedding do not."""
    import yaml
    from hetsim.cli.imports import write_import
    from hetsim.data import data_root
    doc = yaml.safe_load((data_root() / "efficiency.yaml").read_text())
    doc["gpus"]["gh200"] = {"floor_s.Block.fwd": 0.05, "floor_s.Block.bwd": 0.05}
    (tmp_path / "eff.yaml").write_text(yaml.safe_dump(doc))
    files = write_import(GH / "plan_config_N4_D1.json", DATA, OPT, tmp_path / "out", derived=True,
                         efficiency=tmp_path / "eff.yaml")
    profile = hetsim.load_profile(files["profile"])
    blocks = [l for l in profile.layers if l.kind == "Block"]
    assert blocks and all(l.fwd_s["gh200@tp4"] == l.bwd_s["gh200@tp4"] == 0.05 for l in blocks)
    assert all(l.fwd_s["gh200"] < 0.05 for l in blocks) and profile.layers[0].fwd_s["gh200@tp4"] < 0.05


@pytest.mark.parametrize("mutate,field", [
    (lambda d: d.update(mbs="x"), "not a Sailor plan"),
    (lambda d: d.update(mbs=0), "mbs: must be a positive integer"),
    (lambda d: d["pipeline_list"][0].update(tmp_per_stage=None), "not a Sailor plan"),
    (lambda d: d["pipeline_list"][0]["layers_per_stage"].__setitem__(0, []), "no layers or no replicas"),
    (lambda d: d["pipeline_list"][0]["tmp_per_stage"][0][0].__setitem__(1, 0), r"tmp_per_stage\[0\]\[0\]"),
    (lambda d: d["pipeline_list"][0]["tmp_per_stage"][0][0][0][0].__setitem__(0, "TPU-v5"), "no hetsim GPU file"),
])
def test_malformed_sailor_plans_get_one_line_errors(tmp_path, mutate, field):
    doc = json.loads((GH / "plan_config_N4_D2.json").read_text())
    mutate(doc)
    bad = tmp_path / "plan_config_bad.json"
    bad.write_text(json.dumps(doc))
    with pytest.raises(SpecError, match=field):
        import_run(bad, DATA, OPT)


def _mutated(plan: dict, change) -> dict:
    doc = json.loads(json.dumps(plan))
    change(doc)
    return doc


def _set(path: list, value):
    def change(doc):
        *up, last = path
        for key in up:
            doc = doc[key]
        doc[last] = value
    return change


@pytest.mark.parametrize("path, value, message", [
    (["pipeline_list", 0, "layers_per_stage", 1, 0], 11,
     r"pipeline_list\[0\]\.layers_per_stage\[1\]: layer 11 where 12 was expected \(a stage's layers are consecutive"),
    (["pipeline_list", 0, "layers_per_stage", 1, 0], 13, r"layers_per_stage\[1\]: layer 13 where 12 was expected"),
    (["pipeline_list", 0, "layers_per_stage", 1, -1], 40, r"layers_per_stage\[1\]: layer 40 where 25 was expected"),
    (["pipeline_list", 0, "tmp_per_stage", 0, 0, 0, 0, 2], "mars",
     r"tmp_per_stage\[0\]\[0\]: zone 'mars' is not in multizone_bandwidths_het.json \(it has us-central1-a, "),
    (["pipeline_list", 0, "tmp_per_stage", 0, 1, 0, 0, 2], 5, r"tmp_per_stage\[0\]\[1\]: zone: expected a zone name"),
    (["pipeline_list", 0, "tmp_per_stage", 1, 0, 0, 0, 1], 16,
     r"tmp_per_stage\[1\]\[0\]: 16 GPUs per .* node, but basic_cluster_config.json gives .* nodes 8"),
    (["pipeline_list", 0, "layers_per_stage"], "all", r"layers_per_stage: expected a list of stages"),
    (["pipeline_list", 0, "num_stages"], 3, r"num_stages: 3, but layers_per_stage lists 2 stages"),
    (["pipeline_list", 0, "dp"], [0, 1], r"dp: \[0, 1\], but tmp_per_stage lists \[2, 2\]"),
    (["pipeline_list", 0, "tmp_per_stage", 0, 0, 0, 0, 0], "RTX-9090",
     r"tmp_per_stage\[0\]\[0\]: Sailor GPU type 'RTX-9090' has no hetsim GPU file"),
    (["pipeline_list", 0, "tmp_per_stage", 0, 0, 1], "8", r"tmp_per_stage\[0\]\[0\]: .* must be whole numbers"),
    (["mbs"], "2", r"mbs: expected a whole number, got '2'"),
    (["real"], float("nan"), r"real: expected a measured figure > 0, got nan"),
    (["max_mem"], -1, r"max_mem: expected a measured figure > 0"),
    (["N"], 3, r"N: 3 nodes, but the plan's groups take 4"),
    (["pipeline_list", 0, "tmp_per_stage", 0, 0, 0],
     [["RTX-3090", 4, "us-central1-a"], ["RTX-3090", 4, "us-central1-a"]],
     r"tmp_per_stage\[0\]\[0\]: a tensor-parallel group over 2 machines"),
    (["pipeline_list"], [], r"pipeline_list: expected one pipeline, got 0"),
    (["pipeline_list", 0, "tmp_per_stage", 1, 1, 1], 3,
     r"tmp_per_stage\[1\]\[1\]: tensor-parallel degree 3 cannot split OPT-350's 16 attention heads"),
])
def test_a_malformed_sailor_plan_is_one_line_naming_the_file_and_field(tmp_path, path, value, message):
    plan = json.loads((MIT / "plan_config_N4_D2.json").read_text())
    (tmp_path / "p.json").write_text(json.dumps(_mutated(plan, _set(path, value))))
    with pytest.raises(SpecError, match=r"^p\.json: .*" + message):
        import_run(tmp_path / "p.json", DATA, OPT)


@pytest.mark.parametrize("key, value, message", [
    ("hidden_size", "big", "hidden_size: expected a whole number, got 'big'"),
    ("num_layers", 24.5, "num_layers: expected a whole number, got 24.5"),
    ("heads", True, "heads: expected a whole number, got True"),
    ("model", "GPT-3", "profiles_tmp.json: no times for model 'GPT-3', the training config's `model` (it has "),
])
def test_a_malformed_training_config_is_one_line_naming_its_field(tmp_path, key, value, message):
    config = {**json.loads(OPT.read_text()), key: value}
    (tmp_path / "c.json").write_text(json.dumps(config))
    with pytest.raises(SpecError) as caught:
        import_run(MIT / "plan_config_N4_D2.json", DATA, tmp_path / "c.json")
    assert message in str(caught.value) and "\n" not in str(caught.value)
    assert str(caught.value).startswith("c.json: " if key != "model" else "profiles_tmp.json")


def _neo_plan(zone: str, nodes: int) -> dict:
    stage = lambda: [[[["A100-40", 4, zone]], 4]] * (nodes // 2 or 1)
    return {"zone": zone, "mbs": 1, "gbs": 64, "N": nodes,
            "pipeline_list": [{"num_stages": 2 if nodes > 1 else 1,
                               "layers_per_stage": [list(range(17)), list(range(17, 34))] if nodes > 1
                               else [list(range(34))],
                               "tmp_per_stage": [stage(), stage()] if nodes > 1 else [stage()],
                               "dp": [nodes // 2] * 2 if nodes > 1 else [1]}]}


def test_each_node_takes_the_bandwidths_of_its_own_zone(tmp_path):
    neo = DATA / "configs" / "training_config_gpt_neo27.json"
    table = json.loads((DATA / "network" / "multizone_bandwidths_het.json").read_text())
    for zone in ("us-central1-a", "us-west1-b"):
        (tmp_path / f"{zone}.json").write_text(json.dumps(_neo_plan(zone, 4)))
        nic = import_run(tmp_path / f"{zone}.json", DATA, neo).cluster["nodes"][0]["network"]["bandwidth_GBps"]
        assert nic == round(table[zone]["A100-40"]["4"][zone]["A100-40"]["4"][1] / 1e9, 4)


def test_a_one_node_plan_needs_no_bandwidth_between_nodes(tmp_path):
    """A type with no entry in Sailor's network file (A100 80 GB) still imports on one node."""
    plan = _neo_plan("us-central1-a", 1)
    plan["pipeline_list"][0]["tmp_per_stage"] = [[[[["A100-80", 4, "us-central1-a"]], 4]]]
    (tmp_path / "one.json").write_text(json.dumps(plan))
    cluster = import_run(tmp_path / "one.json", DATA, DATA / "configs" / "training_config_gpt_neo27.json",
                         measured_times=False).cluster
    assert len(cluster["nodes"]) == 1 and "network" not in cluster["nodes"][0]
    assert "one node" in cluster["description"]
    plan["N"], plan["pipeline_list"][0]["tmp_per_stage"] = 2, [[[[["A100-80", 4, "us-central1-a"]], 4]] * 2]
    plan["pipeline_list"][0]["dp"], plan["gbs"] = [2], 64
    (tmp_path / "two.json").write_text(json.dumps(plan))
    with pytest.raises(SpecError, match="no bandwidth between two A100-80 nodes of 4 GPUs in us-central1-a"):
        import_run(tmp_path / "two.json", DATA, DATA / "configs" / "training_config_gpt_neo27.json",
                   measured_times=False)


def _run_py(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "experiments" / "peers" / "sailor" / "run.py"), "--data",
                           str(DATA), "--training-config", str(OPT), *args], capture_output=True, text=True)


def test_run_py_predicts_a_plan_without_measurements_beside_the_others_and_draws_what_it_can(tmp_path):
    (tmp_path / "plans").mkdir()
    good = json.loads((MIT / "plan_config_N4_D1.json").read_text())
    (tmp_path / "plans" / "good.json").write_text(json.dumps(good))
    (tmp_path / "plans" / "unmeasured.json").write_text(json.dumps({**good, "real": None, "max_mem": None}))
    done = _run_py("--plans", str(tmp_path / "plans"), "--out", str(tmp_path / "out" / "t.csv"))
    assert done.returncode == 0, done.stderr
    assert "unmeasured: 90.02 s predicted, not measured" in done.stderr
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["t.csv", "t.md", "t.png"]


def test_a_16_bit_import_needs_derived_times_as_sailors_measured_ones_are_fp32(tmp_path, capsys):
    assert main(["import", "sailor", str(GH / "plan_config_N4_D1.json"), "--data", str(DATA), "--training-config",
                 str(OPT), "--precision", "bf16", "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "--precision bf16: Sailor's measured layer times are of FP32 runs" in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_virtual_workers_sync_wait_is_its_first_stages_inside_the_window(tmp_path):
    """N6_D6's replicas wait tens of seconds a wave in the gradient all-reduce for the slowest one, so
    waits cross the steady-state window's edges: the VW's figure counts only their part inside it, as
    its first GPU's does (a wait counted whole when it ended made dp1's 94.7 s against its GPU's 71.0)."""
    out = imported(tmp_path, MIT / "plan_config_N6_D6.json")
    report = hetsim.simulate(out / "cluster.yaml", hetsim.load_profile(out / "profile.yaml"), out / "plan.json",
                             waves=3, warmup_waves=1, trace=False)
    plan = load_plan(out / "plan.json")
    by_gpu = {g.id: g for g in report.gpus}
    for vw, stats in zip(plan.virtual_workers, report.virtual_workers):
        first = by_gpu[vw.stages[0].gpu]
        assert stats.sync_wait_s == pytest.approx(first.sync_wait_s, rel=1e-9)
        assert stats.sync_wait_s <= report.window["duration_s"]
    assert max(v.sync_wait_s for v in report.virtual_workers) > 0.5 * report.window["duration_s"]


def test_run_py_network_latency_what_if_charges_every_message_between_nodes(tmp_path):
    """One 4-stage GH200 plan as imported, and with 2 ms on each inter-node message: its 35 lockstep
    steps a wave (32 micro-batches, 4 stages) each wait at least one such message, so the iteration
    grows by at least 35 x 2 ms; the flag absent, the prediction is the committed table's."""
    plans = tmp_path / "plans"
    plans.mkdir()
    (plans / "plan_config_N8_D2.json").write_text((GH / "plan_config_N8_D2.json").read_text())
    times = {}
    for name, extra in (("as_imported", []), ("latency", ["--network-latency-us", "2000"])):
        done = _run_py("--plans", str(plans), *extra, "--out", str(tmp_path / f"{name}.csv"))
        assert done.returncode == 0, done.stderr
        times[name] = float(pd.read_csv(tmp_path / f"{name}.csv")["predicted_iter_s"].iloc[0])
    committed = pd.read_csv(ROOT / "experiments" / "peers" / "sailor" / "results" / "imported.csv")
    row = committed[(committed["set"] == "gh200-opt350") & (committed["plan"] == "plan_config_N8_D2")]
    assert times["as_imported"] == pytest.approx(float(row["predicted_iter_s"].iloc[0]), rel=1e-5)
    assert times["latency"] - times["as_imported"] >= 35 * 2e-3


@pytest.mark.parametrize("args, message", [
    (["--network-latency-us", "-1"], "--network-latency-us -1.0: a finite number of microseconds >= 0"),
    (["--reserve-gib", "nan"], "--reserve-gib nan: a reserve is a finite number of GiB >= 0"),
    (["--waves", "1"], "--waves 1: at least 2"),
    (["--out", "{tmp}"], "expected a .csv file"),
    (["--plans", str(MIT / "plan_config_N4_D1.json")], "is a file; give folders of Sailor plan *.json files"),
])
def test_run_py_refuses_whole_run_settings_before_any_plan(tmp_path, args, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    done = _run_py(*(["--plans", str(MIT)] if "--plans" not in args else []), *args)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert message in done.stderr and not list(tmp_path.iterdir())


def test_simulating_a_tp_plan_whose_profile_lacks_times_at_its_degree_is_noted(tmp_path):
    from dataclasses import replace
    out = imported(tmp_path, GH / "plan_config_N4_D1.json", "--derived")      # times at TP 1 and 4
    profile = hetsim.load_profile(out / "profile.yaml")
    run = lambda p: hetsim.simulate(out / "cluster.yaml", p, out / "plan.json", waves=2, warmup_waves=1,
                                    trace=False).notes
    assert not any(n.startswith("tensor parallelism") for n in run(profile))
    single = replace(profile, layers=tuple(replace(l, fwd_s={k: v for k, v in l.fwd_s.items() if "@" not in k},
                                                   bwd_s={k: v for k, v in l.bwd_s.items() if "@" not in k})
                                           for l in profile.layers))
    assert any(n.startswith("tensor parallelism: the profile has no times for gh200 at TP 4") for n in run(single))
