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
