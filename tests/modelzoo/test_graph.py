import pytest
import torch

from modelzoo import MODEL_INPUT, build, layer_graph


def run_in_stages(graph, cuts, x):
    boundary = {MODEL_INPUT: x}
    for lo, hi in zip(cuts, cuts[1:]):
        boundary = graph.run(lo, hi, boundary)
        assert sorted(boundary) == graph.crossing(hi)
    return boundary[len(graph) - 1]


@pytest.mark.parametrize("name", ["mlp", "resnet18"])
def test_running_the_stages_in_turn_equals_the_whole_model(name):
    model, x = build(name, batch=2)
    model.eval()
    graph = layer_graph(model)
    n = len(graph)
    with torch.no_grad():
        assert torch.equal(run_in_stages(graph, [0, n // 4, n // 2, 3 * n // 4, n], x), model(x))


def test_gradients_flow_back_through_stage_boundaries():
    model, x = build("resnet18", batch=2)
    graph = layer_graph(model)
    n = len(graph)
    model(x).sum().backward()
    whole = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    run_in_stages(graph, [0, n // 3, n], x).sum().backward()
    assert all(torch.allclose(a, p.grad, atol=1e-5) for a, p in zip(whole, model.parameters()))


def test_residual_branches_cross_cuts_as_extra_tensors():
    graph = layer_graph(build("resnet18")[0])
    # Inside a residual block both the branch and the skip input cross the cut.
    widths = [len(graph.crossing(c)) for c in range(1, len(graph))]
    assert max(widths) == 2 and min(widths) == 1
    assert all(src < dst for src, dst in graph.edges)


@pytest.mark.parametrize("name,millions", [("vgg16", 138.357544), ("vgg19", 143.66724), ("resnet50", 25.557032),
                                           ("resnext50", 25.028904), ("resnet152", 60.192808)])
def test_parameter_counts_match_torchvision(name, millions):
    with torch.device("meta"):
        model = build(name, device="meta")[0]
    graph = layer_graph(model)
    assert sum(graph.param_bytes(i) for i in range(len(graph))) == round(millions * 1e6) * 4
