"""executor.stage's split backward (zero-bubble schedules): input gradient, then weight gradient,
together the same gradients as one backward."""

from __future__ import annotations

import pytest
import torch

import modelzoo
from executor.stage import StageModel


def _stage(lo: int, hi: int, split: bool) -> StageModel:
    torch.manual_seed(0)
    model, _ = modelzoo.build("mlp", batch=1)
    graph = modelzoo.layer_graph(model)
    stage = StageModel(graph, lo, hi, is_last=hi == len(graph), lr=0.1, momentum=0.0)
    stage.split_backward = split
    return stage


@pytest.mark.parametrize("lo,hi", [(2, 6), (4, 9)])      # a middle stage (gradients in and out), the last
def test_input_then_weight_gradient_equal_one_backward(lo, hi):
    full, split = _stage(lo, hi, False), _stage(lo, hi, True)
    x = torch.randn(4, 64 if lo == 0 else 128, generator=torch.Generator().manual_seed(1))
    shapes = [t.shape for t in full.forward(0, (x,), torch.tensor([0, 1, 2, 3]))]
    split.forward(0, (x.clone(),), torch.tensor([0, 1, 2, 3]))
    grad_out = None if full.is_last else tuple(torch.randn(s, generator=torch.Generator().manual_seed(2))
                                               for s in shapes)
    want_in = full.backward(0, grad_out, need_input_grads=True)
    got_in = split.backward_input(0, grad_out, need_input_grads=True)
    assert 0 not in split.grads                     # no weight gradient yet
    split.backward_weight(0)
    assert len(got_in) == len(want_in) and all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got_in, want_in))
    assert len(split.grads[0]) == len(full.grads[0]) > 0
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(split.grads[0], full.grads[0]))
    assert any(g.abs().sum() > 0 for g in split.grads[0])


def test_a_split_backward_on_a_stage_not_built_for_it_is_refused():
    stage = _stage(4, 9, False)
    stage.forward(0, (torch.randn(4, 128),), torch.tensor([0, 1, 2, 3]))
    with pytest.raises(RuntimeError, match="split_backward"):
        stage.backward_input(0, None, need_input_grads=True)


def test_a_stage_holds_each_weight_once_and_the_layers_own_storage_is_freed():
    import modelzoo
    from executor.stage import StageModel
    torch.manual_seed(0)
    net, _ = modelzoo.build("mlp", batch=2, hidden=16, depth=3)
    graph = modelzoo.layer_graph(net)
    before = [p.detach().clone() for p in graph.layers.parameters()]
    stage = StageModel(graph, 0, len(graph), is_last=True, lr=0.1, momentum=0.9)
    assert all(p.untyped_storage().nbytes() == 0 for p in graph.layers.parameters())
    assert all(torch.equal(w, b) for w, b in zip(stage.weights, before))


def test_parameters_sharing_a_storage_each_get_their_own_copy():
    from executor.stage import _take_weights
    shared = torch.nn.Parameter(torch.arange(6.0))
    other = torch.nn.Parameter(torch.ones(2))
    out = _take_weights([shared, other, shared])
    assert [w.tolist() for w in out] == [list(range(6)), [1.0, 1.0], list(range(6))]
    assert out[0].data_ptr() != out[2].data_ptr() and shared.untyped_storage().nbytes() == 0
