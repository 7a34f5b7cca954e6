"""`hetsim profile`: measure, derive, write both formats; one-line errors."""

import subprocess
import sys

import pytest

from hetsim.cli import main
from hetsim.pipedream_graph import read_graph, write_graph
from hetsim.profile_files import load_profile, save_profile
from modelzoo import build, layer_graph


def test_profile_measures_on_cpu_and_derives_for_named_gpu_types(tmp_path, capsys):
    out = tmp_path / "mlp.yaml"
    assert main(["profile", "--model", "mlp", "--batch", "4", "--derive-for", "titan-v,rtx-2060",
                 "--repeats", "1", "--warmup", "0", "--no-progress", "--out", str(out),
                 "--graph-txt", str(tmp_path / "graph.txt")]) == 0
    p = load_profile(out)
    assert p.gpu_types == {"cpu", "titan-v", "rtx-2060"} and p.batch_size == 4
    assert [l.name for l in p.layers] == layer_graph(build("mlp")[0]).names
    assert all(l.saved_bytes for l in p.layers)        # counted beside the measured times, for memory
    g = read_graph(tmp_path / "graph.txt", gpu_type="cpu", batch_size=4)
    assert [l.fwd_s["cpu"] for l in g.layers] == [l.fwd_s["cpu"] for l in p.layers]
    assert "wrote" in capsys.readouterr().out


def test_no_measure_derives_every_gpu_type_from_counts_alone(tmp_path):
    out = tmp_path / "r.json"
    assert main(["profile", "--model", "resnet18", "--batch", "2", "--image-size", "64", "--no-measure",
                 "--derive-for", "all", "--out", str(out)]) == 0
    p = load_profile(out)
    assert "titan-v" in p.gpu_types and "cpu" not in p.gpu_types
    assert len(p.edges) > p.n_layers - 1                           # residual branches kept


@pytest.mark.parametrize("args,message", [
    (["--model", "resnet05"], "--model: unknown model 'resnet05'; did you mean 'resnet50'"),
    (["--model", "mlp", "--derive-for", "titan-x"], "--derive-for: unknown GPU type 'titan-x'; did you mean 'titan-rtx'?"),
    (["--model", "mlp", "--no-measure"], "--no-measure needs --derive-for"),
    (["--model", "mlp", "--model-arg", "hidden=0"], "--model-arg 'hidden=0': expected NAME=INT >= 1"),
    (["--model", "gpt2-small", "--model-arg", "seqlen=64", "--no-measure", "--derive-for", "h100"],
     "--model gpt2-small: cannot be built or run with --model-arg seqlen=64, --batch 32"),
    (["--model", "mlp", "--tp", "2"], "--tp 2: needs --derive-for"),
    (["--model", "mlp", "--tp", "2", "--no-measure", "--derive-for", "h100"], "--tp 2: mlp has no tensor-parallel split"),
    (["--model", "mlp", "--tp", "2,x", "--no-measure", "--derive-for", "h100"], "--tp '2,x': expected comma-separated"),
    (["--model", "gpt2-small", "--model-arg", "seq_len=64", "--tp", "5", "--no-measure", "--derive-for", "h100"],
     "--tp 5: gpt2-small's layers split into tensor-parallel degrees dividing 12 (its attention heads), not 5"),
])
def test_bad_arguments_are_one_line_errors(tmp_path, capsys, args, message):
    assert main(["profile", *args, "--out", str(tmp_path / "x.yaml")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_model_args_reach_the_model_a_derived_profile_counts(tmp_path):
    out = tmp_path / "g.yaml"
    assert main(["profile", "--model", "gpt2-small", "--model-arg", "seq_len=128", "--model-arg", "n_layer=2",
                 "--batch", "2", "--no-measure", "--derive-for", "h100", "--out", str(out)]) == 0
    p = load_profile(out)
    assert p.tokens_per_sample == 128 and [l.kind for l in p.layers].count("Block") == 2
    assert "seq_len=128" in p.source


def test_tp_times_derived_per_rank_slow_a_small_micro_batch_as_the_host_floor_says(tmp_path):
    out = tmp_path / "opt.yaml"
    assert main(["profile", "--model", "opt-350m", "--batch", "1", "--no-measure", "--derive-for", "gh200,h100",
                 "--tp", "1,4", "--precision", "tf32", "--out", str(out), "-q"]) == 0
    p = load_profile(out)
    assert p.time_keys == {"gh200", "gh200@tp4", "h100", "h100@tp4"} and not p.tp_times_include_allreduce
    blocks = [i for i, l in enumerate(p.layers) if l.kind == "Block"]
    lo, hi = blocks[0], blocks[-1] + 1
    # GH200 has a floor of 1.375 / 1.61 ms a block pass (efficiency.yaml); H100 has none, so its rank does a
    # quarter of the GEMMs and attention, the whole norms and the whole per-layer overhead.
    floored = p.stage_times_tp("gh200", lo, hi, 4)
    assert floored.fwd_s == pytest.approx(1.375e-3 * len(blocks)) and floored.bwd_s == pytest.approx(1.61e-3 * len(blocks))
    one, four = p.stage_times("h100", lo, hi), p.stage_times_tp("h100", lo, hi, 4)
    assert one[0] / 4 < four.fwd_s < one[0] and one[1] / 4 < four.bwd_s < one[1]
    assert not four.measured_tp                  # the simulator adds the all-reduces on the node's links


def test_tp_times_cannot_go_into_a_graph_txt_and_types_without_a_floor_are_named(tmp_path, capsys):
    args = ["profile", "--model", "opt-350m", "--model-arg", "n_layer=2", "--batch", "1", "--no-measure", "--tp", "2"]
    assert main([*args, "--derive-for", "gh200", "--out", str(tmp_path / "g.txt")]) == 2
    assert "--tp 2: a graph.txt --out holds one type's single-GPU times" in capsys.readouterr().err
    assert main([*args, "--derive-for", "gh200,h100", "--out", str(tmp_path / "g.yaml"), "-q"]) == 0
    err = capsys.readouterr().err
    assert "warning: TP host floor: h100 has none fitted" in err and "gh200" not in err
    assert "a block pass at least the TP host floor of gh200" in load_profile(tmp_path / "g.yaml").source


def test_hetsim_plan_notes_the_tp_degrees_a_profile_has_no_times_for(tmp_path, capsys):
    prof, cluster = tmp_path / "opt.yaml", tmp_path / "c.yaml"
    assert main(["profile", "--model", "opt-350m", "--model-arg", "n_layer=4", "--batch", "1", "--no-measure",
                 "--derive-for", "gh200", "--tp", "4", "--out", str(prof), "-q"]) == 0
    cluster.write_text("name: c\nnetwork: {kind: infiniband, bandwidth_gbit_s: 200}\n"
                       "nodes:\n  - {name: n0, gpus: [{type: gh200, count: 4}], intra_link: {kind: nvlink, bandwidth_GBps: 450}}\n")
    capsys.readouterr()
    args = ["plan", "--cluster", str(cluster), "--model", str(prof), "--sync", "bsp", "--nm", "2", "-q"]
    assert main([*args, "--tp", "1,4"]) == 0
    assert "tensor parallelism" not in capsys.readouterr().out
    assert main([*args, "--tp", "1,2,4"]) == 0
    assert "note: tensor parallelism: the profile has no times for gh200 at TP 2; " in capsys.readouterr().out


def test_bf16_derived_for_gpus_without_bf16_units_warns_naming_them(tmp_path, capsys):
    args = ["profile", "--model", "mlp", "--batch", "4", "--no-measure", "--precision", "bf16", "-q"]
    assert main([*args, "--derive-for", "v100,a100", "--out", str(tmp_path / "a.yaml")]) == 0
    err = capsys.readouterr().err
    assert "warning: bf16: v100 has no BF16 units" in err and "a100" not in err
    assert main([*args, "--derive-for", "a100", "--out", str(tmp_path / "b.yaml")]) == 0
    assert "warning" not in capsys.readouterr().err


def test_cuda_requested_without_cuda_is_a_clear_error(tmp_path, capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("CUDA is present")
    assert main(["profile", "--model", "mlp", "--device", "cuda", "--out", str(tmp_path / "x.yaml")]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_hetsim_never_imports_torch_outside_the_profile_subcommand():
    code = ("import sys, hetsim, hetsim.cli, hetsim.cli.profile, hetsim.derive, hetsim.profile; "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_measured_and_derived_profile_round_trips_through_both_formats(tmp_path, suffix):
    out = tmp_path / f"p{suffix}"
    main(["profile", "--model", "squeezenet1_0", "--batch", "2", "--image-size", "64", "--repeats", "1",
          "--warmup", "0", "--no-progress", "--derive-for", "titan-v", "--out", str(out)])
    p = load_profile(out)
    save_profile(p, tmp_path / f"again{suffix}")
    assert load_profile(tmp_path / f"again{suffix}") == p
    write_graph(p, tmp_path / "graph.txt", gpu_type="titan-v")
    back = read_graph(tmp_path / "graph.txt", gpu_type="titan-v", batch_size=2)
    assert back.edges == p.edges
    assert [(l.kind, l.param_bytes, l.output_bytes, l.fwd_s["titan-v"], l.bwd_s["titan-v"]) for l in back.layers] \
        == [(l.kind, l.param_bytes, l.output_bytes, l.fwd_s["titan-v"], l.bwd_s["titan-v"]) for l in p.layers]


def test_precision_tf32_speeds_up_blocks_on_ampere_and_leaves_a_gpu_without_tf32_as_it_was(tmp_path):
    times = {}
    for precision in ("fp32", "tf32"):
        out = tmp_path / f"{precision}.json"
        assert main(["profile", "--model", "gpt2-small", "--batch", "1", "--no-measure", "--derive-for",
                     "a100,v100", "--precision", precision, "--out", str(out)]) == 0
        p = load_profile(out)
        block = next(l for l in p.layers if l.kind == "Block")
        times[precision] = {g: block.fwd_s[g] + block.bwd_s[g] for g in ("a100", "v100")}
    assert times["tf32"]["a100"] < times["fp32"]["a100"] / 1.5
    assert times["tf32"]["v100"] == times["fp32"]["v100"]
    assert "at tf32" in p.source


def test_fused_attention_derives_a_faster_block_than_materialized_and_says_which(tmp_path):
    block = {}
    for attention in ("fused", "materialized"):
        out = tmp_path / f"{attention}.json"
        assert main(["profile", "--model", "gpt2-small", "--batch", "1", "--no-measure", "--derive-for", "h200",
                     "--precision", "bf16", "--attention", attention, "--out", str(out)]) == 0
        p = load_profile(out)
        assert f"attention counted {attention}" in p.source
        assert p.tokens_per_sample == build("gpt2-small", device="meta")[1].shape[1]    # reports give tokens/s
        b = next(l for l in p.layers if l.kind == "Block")
        block[attention] = (b.fwd_s["h200"] + b.bwd_s["h200"], b.saved_bytes)
    assert block["fused"][0] < block["materialized"][0]
    assert block["fused"][1] < block["materialized"][1]        # the s x s probabilities, kept


def test_tf32_measured_on_a_cpu_says_it_changed_nothing(tmp_path, capsys):
    assert main(["profile", "--model", "mlp", "--batch", "2", "--precision", "tf32", "--repeats", "1",
                 "--warmup", "0", "-q", "--out", str(tmp_path / "p.yaml")]) == 0
    assert "--precision tf32 has no effect on --device cpu" in capsys.readouterr().err


def test_block_parts_by_kernel_class_add_up_to_the_counted_block():
    from modelzoo.kernel_classes import split_by_kernel_class
    from modelzoo.counting import count_model
    shape = {"n_layer": 2, "seq_len": 64}
    counted = count_model("gpt2-small", batch=2, **shape)
    split = split_by_kernel_class("gpt2-small", 2, counted, **shape)
    totals = lambda c: (c.kind, c.flops_fwd, c.flops_bwd, c.bytes_fwd, c.bytes_bwd)
    assert [totals(c) for c in split] == [totals(c) for c in counted]
    block = split[1]
    assert [p.kind for p in block.parts] == ["gemm", "attention", "elementwise", "norm"]
    assert block.parts[0].flops_fwd == 2 * 2 * 64 * 12 * 768**2          # 2 x tokens x the 12 d^2 weights
    assert block.parts[1].flops_fwd == 2 * 2 * 2 * 64**2 * 768             # QK^T and AV: 2 x 2 x b s^2 d
    assert all(c.parts == () for c in split if c.kind != "Block")


def test_a_gpu_type_a_cluster_file_defines_is_derived_with_cluster(tmp_path, capsys):
    cluster = tmp_path / "c.yaml"
    cluster.write_text("""name: custom
network: {kind: ethernet, bandwidth_GBps: 1}
gpu_types:
  - {name: my-gpu, display_name: My GPU, memory_gib: 16, memory_bandwidth_GBps: 900, peak_fp32_tflops: 15,
     peak_fp16_tflops: 60, tensor_cores: true, sources: [test]}
nodes:
  - {name: n0, gpus: [{type: my-gpu, count: 2}], intra_link: {kind: pcie, gen: 3}}
""")
    out = tmp_path / "p.yaml"
    args = ["profile", "--model", "mlp", "--batch", "8", "--no-measure", "--derive-for", "my-gpu", "--out", str(out), "-q"]
    assert main(args) == 2
    assert "unknown GPU type 'my-gpu'" in capsys.readouterr().err
    assert main(args + ["--cluster", str(cluster)]) == 0
    assert load_profile(out).gpu_types == {"my-gpu"}


def test_deriving_for_the_measured_type_keeps_its_measurement(tmp_path):
    """--device-type v100 --derive-for v100,t4 (or `all`): v100's times are the ones measured here, not
    derived ones; t4 is derived."""
    args = ["profile", "--model", "mlp", "--batch", "4", "--model-arg", "hidden=64", "--model-arg", "depth=2",
            "--repeats", "1", "--warmup", "0", "--no-progress"]
    assert main(args + ["--device-type", "v100", "--out", str(tmp_path / "measured.yaml")]) == 0
    assert main(args + ["--device-type", "v100", "--derive-for", "v100,t4", "--out", str(tmp_path / "both.yaml")]) == 0
    assert main(args + ["--no-measure", "--derive-for", "v100,t4", "--out", str(tmp_path / "derived.yaml")]) == 0
    measured, both, derived = (load_profile(tmp_path / f"{n}.yaml") for n in ("measured", "both", "derived"))
    assert [l.fwd_s["t4"] for l in both.layers] == [l.fwd_s["t4"] for l in derived.layers]
    assert [l.fwd_s["v100"] for l in both.layers] != [l.fwd_s["v100"] for l in derived.layers]
    assert "v100: its measured times kept" in both.source
    # measured twice, the times differ run to run; what matters is that they are CPU-measured, not derived:
    # a derived V100 runs this tiny MLP's layers in microseconds, far below the CPU's
    assert sum(l.fwd_s["v100"] for l in both.layers) > 2 * sum(l.fwd_s["v100"] for l in derived.layers)
