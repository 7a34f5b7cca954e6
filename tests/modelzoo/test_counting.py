"""Operation counts on the meta device against published counts (multiply-add = 2 FLOPs)."""

import pytest

from modelzoo.counting import count_model, counted_profile


@pytest.mark.parametrize("name,gmacs", [("vgg16", 15.5), ("resnet50", 4.1)])
def test_forward_flops_per_224_image_match_published_multiply_add_counts(name, gmacs):
    costs = count_model(name, batch=2)
    gflops_per_image = sum(c.flops_fwd for c in costs) / 2 / 1e9
    assert gflops_per_image == pytest.approx(2 * gmacs, rel=0.02)


def test_backward_does_about_twice_the_forward_work_and_moves_bytes():
    costs = count_model("resnet18", batch=1, image_size=64)
    fwd, bwd = sum(c.flops_fwd for c in costs), sum(c.flops_bwd for c in costs)
    assert 1.8 < bwd / fwd < 2.0              # the first convolution computes no input gradient
    assert all(c.bytes_fwd > 0 for c in costs if c.kind in ("Conv2d", "ReLU", "BatchNorm2d"))


def test_counted_profile_has_the_layer_graph_bytes_and_no_times():
    profile, costs = counted_profile("mlp", 8, hidden=32, depth=2, in_features=16)
    assert [l.output_bytes for l in profile.layers] == [8 * 32 * 4] * 4 + [8 * 10 * 4]
    assert profile.param_bytes == 4 * (16 * 32 + 32 + 32 * 32 + 32 + 32 * 10 + 10)
    assert [l.flops_fwd for l in profile.layers] == [c.flops_fwd for c in costs]
    assert costs[0].flops_fwd == 2 * 8 * 16 * 32 and costs[1].flops_fwd == 0
    assert profile.gpu_types == set()
