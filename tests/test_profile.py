import re

import pytest

from conftest import PIPEDREAM_PROFILES, profile
from hetsim.errors import PlanError, SpecError
from hetsim.pipedream_graph import parse_graph, read_graph, write_graph
from hetsim.profile import LayerProfile, ModelProfile, profile_from_dict, tp_note, tp_split_note, update_note
from hetsim.profile_files import load_profile, save_profile


def test_builtin_vgg19_profile_matches_published_counts():
    p = load_profile("vgg19_b32_analytic")
    assert p.param_bytes == 143_667_240 * 4                       # torchvision's VGG-19: 143.67 M
    gflops = sum(l.flops_fwd for l in p.layers) / p.batch_size / 1e9
    assert gflops == pytest.approx(2 * 19.63, rel=0.01)           # 19.6 G multiply-adds per image
    assert "not measured" in p.source


def test_derived_times_order_gpus_as_their_datasheets():
    p = load_profile("vgg19_b32_analytic")
    total = {t: sum(p.stage_times(t, 0, p.n_layers)) for t in p.gpu_types}
    assert total["h100"] < total["a100"] < total["titan-rtx"] < total["titan-v"] < total["rtx-2060"] \
        < total["quadro-p4000"]


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_profile_round_trips_through_its_own_format(tmp_path, suffix):
    p = load_profile("vgg19_b32_analytic")
    save_profile(p, tmp_path / f"p{suffix}")
    assert load_profile(tmp_path / f"p{suffix}") == p


def test_tp_allreduce_calls_round_trip_and_are_left_out_where_none_are_given(tmp_path):
    from dataclasses import replace
    p = load_profile("vgg19_b32_analytic")
    layers = (replace(p.layers[0], tp_allreduce_bytes=4096, tp_allreduce_calls=3), *p.layers[1:])
    tp = replace(p, layers=layers)
    save_profile(tp, tmp_path / "p.yaml")
    assert load_profile(tmp_path / "p.yaml") == tp
    assert "tp_allreduce_calls" not in (tmp_path / "p.yaml").read_text().split("- name:")[2]


def test_backward_all_reduces_round_trip_where_they_differ_from_the_forwards(tmp_path):
    from dataclasses import replace
    p = load_profile("vgg19_b32_analytic")
    lookup = replace(p.layers[0], tp_allreduce_bytes=4096, tp_allreduce_bwd_bytes=0)
    head = replace(p.layers[1], tp_allreduce_bwd_bytes=2048, tp_allreduce_bwd_calls=2)
    same = replace(p.layers[2], tp_allreduce_bytes=1024, tp_allreduce_calls=2, tp_allreduce_bwd_bytes=1024,
                   tp_allreduce_bwd_calls=2)
    assert same.tp_allreduce_bwd_bytes is None and (same.tp_bwd_bytes, same.tp_bwd_calls) == (1024, 2)
    tp = replace(p, layers=(lookup, head, same, *p.layers[3:]))
    save_profile(tp, tmp_path / "p.yaml")
    assert load_profile(tmp_path / "p.yaml") == tp
    assert [(l.tp_bwd_bytes, l.tp_bwd_calls) for l in tp.layers[:3]] == [(0, 0), (2048, 2), (1024, 2)]
    assert "tp_allreduce_bwd" not in (tmp_path / "p.yaml").read_text().split("- name:")[3]
    doc = tp.to_dict()
    doc["layers"][0]["tp_allreduce_bwd_calls"] = 1
    import yaml
    from hetsim.errors import HetsimError
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(HetsimError, match=r"layers\[0\]\.tp_allreduce_bwd_calls: calls of no bytes"):
        load_profile(tmp_path / "bad.yaml")


def test_shared_and_nonfloat_saved_bytes_round_trip_and_a_share_with_no_earlier_layer_is_named(tmp_path):
    p = load_profile("resnet18_b32")
    assert any(l.saved_shared_earlier for l in p.layers) and any(l.saved_nonfloat_bytes for l in p.layers)
    save_profile(p, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == p
    i = next(k for k, l in enumerate(p.layers) if l.saved_shared_earlier)
    assert p.scaled_to_batch(64).layers[i].saved_shared_earlier == tuple(
        (j, 2 * b) for j, b in p.layers[i].saved_shared_earlier)
    import json
    from hetsim.errors import HetsimError
    doc = p.to_dict()
    for bad, message in [([[i - 1, 8]], f"layer {i - 1} is not earlier than the layer before layer {i}"),
                         ([[0, -8]], "expected \\[layer index, bytes\\]"), ("x", "expected a list")]:
        doc["layers"][i]["saved_shared_earlier"] = bad
        (tmp_path / "bad.json").write_text(json.dumps(doc))
        with pytest.raises(HetsimError, match=rf"layers\[{i}\]\.saved_shared_earlier.*{message}"):
            load_profile(tmp_path / "bad.json")


def test_profile_round_trips_through_pipedream_graph_txt(tmp_path):
    p = load_profile("vgg19_b32_analytic")
    only = ModelProfile(**{**p.__dict__, "layers": tuple(
        type(l)(**{**l.__dict__, "fwd_s": {"titan-v": l.fwd_s["titan-v"]},
                   "bwd_s": {"titan-v": l.bwd_s["titan-v"]}, "flops_fwd": None}) for l in p.layers)})
    write_graph(only, tmp_path / "graph.txt", gpu_type="titan-v")
    back = read_graph(tmp_path / "graph.txt", gpu_type="titan-v", batch_size=p.batch_size)
    assert [(l.param_bytes, l.output_bytes, l.fwd_s, l.bwd_s, l.kind) for l in back.layers] == \
        [(l.param_bytes, l.output_bytes, l.fwd_s, l.bwd_s, l.kind) for l in only.layers]
    assert back.edges == only.edges


def test_pipedream_published_profiles_load_with_their_dags():
    vgg = read_graph(PIPEDREAM_PROFILES / "vgg16.txt", batch_size=128)
    assert vgg.param_bytes == pytest.approx(138.36e6 * 4, rel=1e-3)
    resnet = read_graph(PIPEDREAM_PROFILES / "resnet50.txt")
    assert len(resnet.edges) > resnet.n_layers - 1               # branches kept
    assert all(src < dst for src, dst in resnet.edges)             # topological order
    text = (PIPEDREAM_PROFILES / "resnet50.txt").read_text()
    assert parse_graph(text, source_name="r50").layers == resnet.layers


NODE = "{n} -- Conv -- forward_compute_time={f}, backward_compute_time=2.0, activation_size=8.0, parameter_size=4.0"


@pytest.mark.parametrize("text, message", [
    ("", "g.txt: no layers"),
    (NODE.format(n="node1", f="-1.0"), "line 1: forward_compute_time=-1.0: must be finite and >= 0"),
    (NODE.format(n="node1", f="inf"), "line 1: forward_compute_time=inf: must be finite and >= 0"),
    (NODE.format(n="node1", f="abc"), "line 1: forward_compute_time=abc: not a number"),
    (NODE.format(n="node1", f="1e40"), "line 1: forward_compute_time=1e40: must be finite and >= 0"),
    (f"{NODE.format(n='node1', f='1')}\n{NODE.format(n='node1', f='2')}", "line 2: node node1 is listed twice"),
    (f"{NODE.format(n='node1', f='1')}\n{NODE.format(n='node2', f='2')}", "node node2 is joined to node node1 by no edge"),
])
def test_a_malformed_graph_txt_is_one_line_naming_the_line(text, message):
    with pytest.raises(SpecError, match="^g.txt: .*" + re.escape(message.removeprefix("g.txt: "))):
        parse_graph(text, source_name="g.txt")


def test_an_edge_listed_twice_counts_once():
    text = f"{NODE.format(n='node1', f='1')}\n{NODE.format(n='node2', f='2')}\n\tnode1 -- node2\n\tnode1 -- node2"
    assert parse_graph(text, source_name="g.txt").edges == ((0, 1),)


def test_a_yaml_profile_whose_layers_are_not_one_graph_or_lack_a_time_is_refused_naming_the_field():
    doc = load_profile("vgg19_b32_analytic").to_dict()
    with pytest.raises(SpecError, match=r"^p.yaml: edges: layer 1 is joined to layer 0 by no edge"):
        profile_from_dict({**doc, "edges": []}, "p.yaml")
    layers = [dict(l) for l in doc["layers"]]
    layers[0]["fwd_s"] = {k: v for k, v in layers[0]["fwd_s"].items() if k != "titan-v"}
    with pytest.raises(SpecError, match=r"^p.yaml: layers\[0\].fwd_s: missing titan-v: every layer needs"):
        profile_from_dict({**doc, "layers": layers}, "p.yaml")


def test_cut_bytes_count_every_output_crossing_a_branching_cut():
    p = profile(4, 0.1, 0.1, out_bytes=10)
    branchy = ModelProfile(**{**p.__dict__, "edges": ((0, 1), (0, 3), (1, 2), (2, 3))})
    assert branchy.cut_bytes(2) == 20          # outputs of layer 1 and the skip from layer 0
    assert p.cut_bytes(2) == 10 and p.cut_bytes(0) == p.input_bytes and p.cut_bytes(4) == 0


def test_scaling_to_another_batch_is_linear_and_says_so():
    p = profile(2, 0.1, 0.2, out_bytes=100, batch=32).scaled_to_batch(64)
    assert p.stage_times("test-gpu", 0, 2) == pytest.approx((0.4, 0.8))
    assert p.layers[0].output_bytes == 200 and "scaled linearly" in p.source


def test_missing_gpu_type_tells_how_to_derive_it():
    with pytest.raises(PlanError, match="hetsim profile --derive-for a100"):
        profile(2, 0.1, 0.1).stage_times("a100", 0, 1)


@pytest.mark.parametrize("edit,message", [
    ({"edges": [[1, 0]]}, "p.yaml: edges[0]: [1, 0] must satisfy"),
    ({"batch_size": 0}, "p.yaml: batch_size: must be > 0"),
    ({"layers": [{"name": "x", "param_bytes": 1, "output_bytes": 1, "fwd_s": {"g": -1}, "bwd_s": {"g": 1}}]},
     "p.yaml: layers[0].fwd_s.g: must be >= 0"),
])
def test_bad_profiles_name_the_field(edit, message):
    doc = {"model": "m", "batch_size": 1, "input_bytes": 0,
           "layers": [{"name": f"l{i}", "param_bytes": 1, "output_bytes": 1, "fwd_s": {"g": 1},
                       "bwd_s": {"g": 1}} for i in range(2)]}
    with pytest.raises(SpecError, match=message.replace("[", r"\[").replace("]", r"\]")):
        profile_from_dict({**doc, **edit}, "p.yaml")


def test_all_reduce_calls_without_bytes_are_refused_naming_the_field(tmp_path):
    import yaml
    from hetsim.errors import HetsimError
    doc = load_profile("vgg19_b32_analytic").to_dict()
    doc["layers"][0]["tp_allreduce_calls"] = 2
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(HetsimError, match=r"layers\[0\]\.tp_allreduce_calls: calls of no bytes"):
        load_profile(tmp_path / "p.yaml")


def test_a_profile_taken_at_another_precision_than_the_plans_is_noted_and_its_precision_round_trips():
    from dataclasses import replace

    import hetsim
    analytic = load_profile("vgg19_b32_analytic")
    assert analytic.precision is None and load_profile("vgg19_b32").precision == "fp32"
    quiet = hetsim.simulate(profile=analytic, waves=3, warmup_waves=1, trace=False)
    assert not any(n.startswith("precision:") for n in quiet.notes)
    bf16 = replace(analytic, precision="bf16")
    noted = hetsim.simulate(profile=bf16, waves=3, warmup_waves=1, trace=False)
    assert any(n.startswith("precision: the profile's times are at bf16, the plan trains at fp32") for n in noted.notes)
    assert noted.throughput == quiet.throughput                        # a note, not a change
    assert profile_from_dict(bf16.to_dict(), "p").precision == "bf16"
    with pytest.raises(SpecError, match="precision: 'fp8' is not one of"):
        profile_from_dict({**bf16.to_dict(), "precision": "fp8"}, "p")


def test_tp_note_names_the_shipped_types_and_degrees_the_profile_would_divide_single_gpu_times_for():
    times = {"a100": 1.0, "v100": 1.0, "cpu": 1.0, "a100@tp4": 0.3}
    layer = LayerProfile(name="b", kind="Block", fwd_s=times, bwd_s=times, param_bytes=0, output_bytes=0)
    p = ModelProfile(model="m", batch_size=1, layers=(layer,), edges=(), input_bytes=0, tp_divisor=16)
    assert tp_note(p, {("a100", 1), ("a100", 4), ("v100", 1)}) is None
    # h100: no times at all (another error); cpu: a measured host, whose TP the simulator divides on purpose
    note = tp_note(p, {("a100", 2), ("a100", 4), ("v100", 2), ("v100", 4), ("h100", 2), ("cpu", 2)})
    assert note.startswith("tensor parallelism: the profile has no times for a100 at TP 2; v100 at TP 2, 4; ")
    assert "hetsim profile --derive-for TYPE --tp T" in note and "cpu" not in note


def test_a_profile_with_tp_times_is_not_rescaled_to_another_batch():
    times = {"a100": 1.0, "a100@tp4": 0.3}
    layer = LayerProfile(name="b", kind="Block", fwd_s=times, bwd_s=times, param_bytes=0, output_bytes=0)
    p = ModelProfile(model="m", batch_size=4, layers=(layer,), edges=(), input_bytes=0)
    assert p.scaled_to_batch(4) is p
    with pytest.raises(PlanError, match=r"times at tensor-parallel degrees \(a100@tp4\) do not scale from minibatch 4 "
                                        r"to 1 .*derive or measure the profile at minibatch 1"):
        p.scaled_to_batch(1)


def test_simulating_bf16_on_gpus_without_bf16_units_is_noted():
    from dataclasses import replace

    import hetsim
    plan = hetsim.load_plan("hetpipe_vgg19_ed")
    notes = hetsim.simulate(plan=replace(plan, precision="bf16"), waves=3, warmup_waves=1, trace=False).notes
    bf16 = [n for n in notes if n.startswith("bf16: ")]
    assert bf16 and "quadro-p4000, rtx-2060, titan-rtx, titan-v have no BF16 units" in bf16[0]
    assert not any(n.startswith("bf16: ") for n in hetsim.simulate(plan=plan, waves=3, warmup_waves=1,
                                                                      trace=False).notes)


def test_tp_on_a_profile_without_a_tensor_parallel_split_is_noted():
    from dataclasses import replace
    cnn = load_profile("vgg19_b32")
    assert cnn.tp_divisor is None and tp_split_note(cnn, {1}) is None
    assert "records no tensor-parallel split" in tp_split_note(cnn, {1, 2})
    assert tp_split_note(replace(cnn, tp_divisor=16), {2}) is None


def test_types_whose_times_carry_no_optimizer_step_are_noted():
    times = {"a100": 1.0, "v100": 1.0, "a100@tp2": 0.6}
    stepped = LayerProfile(name="b", kind="Block", fwd_s=times, bwd_s=times, param_bytes=0, output_bytes=0,
                           update_s={"a100": 0.01, "a100@tp2": 0.0})
    p = ModelProfile(model="m", batch_size=1, layers=(stepped,), edges=(), input_bytes=0)
    assert update_note(p, {("a100", 1)}) is None
    note = update_note(p, {("a100", 1), ("a100", 2), ("v100", 1), ("v100", 4)})     # v100 at TP 4: its TP-1 key
    assert note.startswith("optimizer step: the profile gives a100, v100 no update_s, so each step is charged no time")
