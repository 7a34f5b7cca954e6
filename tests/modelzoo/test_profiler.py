import time

import pytest
import torch
from torch import nn

from modelzoo import build, layer_graph
from modelzoo.profiler import measure_graph_profile, measure_profile, whole_model_forward_s


def test_profile_layers_are_the_layer_graph_in_order_with_its_edges():
    graph = layer_graph(build("resnet18", image_size=32)[0])
    profile = measure_profile("resnet18", 2, image_size=32, repeats=1, warmup=0, device_type="my-cpu")
    assert [l.name for l in profile.layers] == graph.names
    assert [l.kind for l in profile.layers] == graph.kinds
    assert list(profile.edges) == graph.edges
    assert profile.gpu_types == {"my-cpu"} and profile.batch_size == 2


def test_parameter_bytes_add_up_to_four_bytes_per_parameter_and_outputs_are_whole_minibatch():
    model, x = build("mlp", batch=8, hidden=32, depth=2, in_features=16)
    profile = measure_graph_profile(layer_graph(model), x, model="mlp", repeats=1, warmup=0)
    assert profile.param_bytes == 4 * sum(p.numel() for p in model.parameters())
    assert [l.output_bytes for l in profile.layers] == [8 * 32 * 4] * 4 + [8 * 10 * 4]
    assert profile.input_bytes == 8 * 16 * 4


def test_layers_with_weights_have_positive_backward_time():
    profile = measure_profile("vgg11", 1, image_size=32, repeats=1, warmup=0)
    for layer in profile.layers:
        assert layer.fwd_s["cpu"] > 0
        if layer.param_bytes:
            assert layer.bwd_s["cpu"] > 0


def test_threads_are_set_for_the_measurement_and_restored():
    before = torch.get_num_threads()
    profile = measure_profile("mlp", 4, threads=1, repeats=1, warmup=0)
    assert "1 threads" in profile.source
    assert torch.get_num_threads() == before


class _Sleep(nn.Module):
    """A layer whose forward takes at least a known time, and little more unless its wake-up is late:
    unlike computing, sleeping does not slow down when other jobs take the cores."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds = seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(self.seconds)
        return x * 1.0


def test_each_layer_is_timed_alone_and_the_layer_times_add_up_to_the_whole_forward():
    sleeps = [0.005, 0.020, 0.040]
    graph = layer_graph(nn.Sequential(*(_Sleep(s) for s in sleeps)), leaf_modules=(_Sleep,))
    x = torch.ones(2, 3)
    profile = measure_graph_profile(graph, x, repeats=3, warmup=1, statistic="min")
    forward = [l.fwd_s["cpu"] for l in profile.layers]
    # A sleep never ends early; the minimum of three passes is late by 10 ms only if every pass's
    # wake-up is, while timing one layer as another would be off by 15 ms or more.
    assert all(s <= f < s + 0.010 for s, f in zip(sleeps, forward)), forward
    whole = whole_model_forward_s(graph, x, repeats=3, warmup=1, statistic="min")
    assert sum(forward) == pytest.approx(whole, rel=0.1)


def test_sum_of_layer_forward_times_of_a_real_model_is_near_a_whole_model_forward():
    model, x = build("vgg11", batch=4, image_size=64)
    graph = layer_graph(model)
    # Only gross errors are caught here, such as backward work timed in a forward (about x3). On
    # shared 2-core machines the ratio was x1.01 on one and x1.21 on another, for reasons not
    # established, so a per-layer bias of that size is not checked here; benchmarks/bench_profile.py
    # measures the ratio for a chosen model and thread count. Rounds interleave the two measurements
    # so that a slow spell falls on both sides; minima estimate the uncontended times.
    layers_s, whole_s = [], []
    for _ in range(4):
        profile = measure_graph_profile(graph, x, repeats=3, warmup=1, threads=1, statistic="min")
        layers_s.append(sum(l.fwd_s["cpu"] for l in profile.layers))
        whole_s.append(whole_model_forward_s(graph, x, repeats=3, warmup=1, threads=1, statistic="min"))
    assert 1 / 1.5 < min(layers_s) / min(whole_s) < 1.5


def test_bad_repeat_counts_are_rejected():
    with pytest.raises(ValueError, match="repeats"):
        measure_profile("mlp", 2, repeats=0)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_16_bit_measurement_runs_the_model_in_16_bit_and_keeps_fp32_byte_counts(precision, monkeypatch):
    import modelzoo.profiler as profiler
    seen = {}
    passes = profiler._passes

    def spy(graph, example, *args):
        seen["weights"] = {p.dtype for p in graph.layers.parameters()}
        return passes(graph, example, *args)
    monkeypatch.setattr(profiler, "_passes", spy)
    tiny = dict(n_layer=1, seq_len=16, d_model=32, n_head=2, vocab_size=64)
    full = measure_profile("gpt2-small", 2, repeats=1, warmup=0, **tiny)
    assert seen["weights"] == {torch.float32}
    half = measure_profile("gpt2-small", 2, repeats=1, warmup=0, precision=precision, **tiny)
    assert seen["weights"] == {getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[precision])}
    assert [l.param_bytes for l in half.layers] == [l.param_bytes for l in full.layers]
    assert [l.output_bytes for l in half.layers] == [l.output_bytes for l in full.layers]
    assert f"{precision}," in half.source and "fp32," not in full.source


@pytest.mark.skipif(not hasattr(torch.backends.cuda.matmul, "fp32_precision"), reason="torch < 2.9: legacy switches")
@pytest.mark.parametrize("precision,want", [("tf32", "tf32"), ("fp32", "ieee"), ("bf16", "ieee")])
def test_tf32_is_set_for_the_measurement_and_restored(precision, want, monkeypatch):
    import modelzoo.profiler as profiler
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    seen = {}
    passes = profiler._passes

    def spy(*args):
        seen["switches"] = (matmul.fp32_precision, conv.fp32_precision)
        return passes(*args)
    monkeypatch.setattr(profiler, "_passes", spy)
    before = (matmul.fp32_precision, conv.fp32_precision)
    measure_profile("mlp", 2, repeats=1, warmup=0, precision=precision)
    assert seen["switches"] == (want, want)
    assert (matmul.fp32_precision, conv.fp32_precision) == before
    measure_profile("mlp", 2, repeats=1, warmup=0)             # no precision: the switches as they are
    assert seen["switches"] == before


def test_a_graph_in_the_wrong_dtype_or_an_unknown_precision_is_refused():
    model, x = build("mlp", batch=2, hidden=8, depth=1, in_features=4)
    with pytest.raises(ValueError, match="bfloat16"):
        measure_graph_profile(layer_graph(model), x, repeats=1, warmup=0, precision="bf16")
    with pytest.raises(ValueError, match="precision must be one of"):
        measure_profile("mlp", 2, precision="fp8")
