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
    held = split.inflight[0]
    # Kept for W: weighted layers' outputs and their gradients, but never the head's on the last stage
    # (its W starts from the loss, which keeps what it needs); ReLUs have no weights.
    weighted = [i - lo for i in split.module.weighted]
    last = hi - lo - 1 if split.is_last else None
    assert [i for i, o in enumerate(held.layer_outputs) if o is not None] == [i for i in weighted if i != last]
    assert [i for i, g in enumerate(held.layer_grads) if g is not None] == [i for i in weighted if i != last]
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


def _wave(stage: StageModel, lo: int, hi: int, waves: int = 2, nm: int = 3) -> list[torch.Tensor]:
    """`waves` flush waves of `nm` minibatches on stage [lo, hi) of the MLP (a middle stage gets
    fixed output gradients); the BSP vector before each step, then the weights after the last."""
    gen = torch.Generator().manual_seed(3)
    width = 64 if lo == 0 else 128
    seen = []
    for _ in range(waves):
        for k in range(nm):
            out = stage.forward(k, (torch.randn(4, width, generator=gen),), torch.tensor([0, 1, 2, 3]))
            grad_out = None if stage.is_last else tuple(torch.randn(o.shape, generator=gen) for o in out)
            if stage.split_backward:
                stage.backward_input(k, grad_out, need_input_grads=lo > 0)
                stage.backward_weight(k)
            else:
                stage.backward(k, grad_out, need_input_grads=lo > 0)
            if stage.sum_in_backward:
                assert not stage.grads                # nothing kept whole for accumulate to add
            stage.accumulate(k)
        seen.append(stage.wave_flat().clone())
        stage.step()
    return seen + list(stage.weights)


@pytest.mark.parametrize("lo,hi", [(2, 6), (4, 9), (1, 2)])       # middle, last, a stage with no weights
@pytest.mark.parametrize("split,flat", [(False, False), (True, False), (False, True), (True, True)])
def test_summing_inside_the_backward_takes_the_same_steps_bit_for_bit(lo, hi, split, flat):
    explicit, inside = _stage(lo, hi, split), _stage(lo, hi, split)
    explicit.flat_grads = inside.flat_grads = flat
    inside.sum_in_backward = True
    want, got = _wave(explicit, lo, hi), _wave(inside, lo, hi)
    assert len(want) == len(got) and all(torch.equal(a, b) for a, b in zip(want, got))
    if flat and inside.weights:
        assert got[0].numel() == inside.numel and got[0].abs().sum() > 0     # the all-reduce's vector
    before = _stage(lo, hi, split).weights
    assert not inside.weights or not all(torch.equal(a, b) for a, b in zip(inside.weights, before))


def test_a_layer_without_a_gradient_keeps_the_waves_sum_of_its_weights():
    """Zero-bubble's weight pass skips a layer whose output got no gradient; its weights' sum so far
    in the wave stays (and, under BSP, stays in the vector the all-reduce sums)."""
    stage = _stage(4, 9, True)
    stage.sum_in_backward = stage.flat_grads = True
    for k in range(2):
        stage.forward(k, (torch.randn(4, 128),), torch.tensor([0, 1, 2, 3]))
        stage.backward_input(k, None, need_input_grads=True)
        if k:
            stage.inflight[k].layer_grads[0] = None          # layer 4 gets nothing this time
        stage.backward_weight(k)
        stage.accumulate(k)
        if not k:
            first = stage.wave_flat().clone()
    n = stage.weights[0].numel()
    assert stage.wave_flat()[:n].abs().sum() > 0
    assert torch.equal(stage.wave_flat()[:n], first[:n])
    assert all(a.data_ptr() == b.data_ptr() for a, b in zip(stage._acc, _views_of(stage)))


def _views_of(stage: StageModel) -> list[torch.Tensor]:
    from executor.stage import _views
    return _views(stage._acc_flat, stage.weights)


def test_summing_inside_the_backward_holds_one_parameters_gradient_beside_the_sum_not_all():
    """The peak of a wave's second backward, from torch's own CPU allocation records: added after the
    backward, the minibatch's whole gradient set exists beside the sum; added by autograd as each
    weight's gradient comes, only one weight's."""
    from modelzoo.cpu_memory import peak_bytes_during

    def peak_bytes(inside: bool) -> tuple[int, int]:
        torch.manual_seed(0)
        graph = modelzoo.layer_graph(modelzoo.build("mlp", batch=1, hidden=512, depth=4)[0])
        stage = StageModel(graph, 0, len(graph), is_last=True, lr=0.1, momentum=0.0)
        stage.sum_in_backward = inside
        x, y = torch.randn(8, 64), torch.tensor([0, 1, 2, 3] * 2)
        stage.forward(0, (x,), y), stage.backward(0, None, False), stage.accumulate(0)
        stage.forward(1, (x,), y)
        top = peak_bytes_during(lambda: (stage.backward(1, None, False), stage.accumulate(1)))
        if top is None:
            pytest.skip("this torch's profiler keeps no allocation records")
        return top, max(w.numel() * 4 for w in stage.weights)

    (after, largest), (inside, _) = peak_bytes(False), peak_bytes(True)
    grads = 4 * sum(p.numel() for p in modelzoo.build("mlp", batch=1, hidden=512, depth=4)[0].parameters())
    assert after >= grads                       # the whole set (3.3 MB here)
    assert inside < largest + grads // 4        # one 512 x 512 weight's gradient (1 MB) and small change


def test_an_input_tensor_used_again_gets_its_own_gradient_not_the_sum_of_both():
    stage = _stage(4, 9, False)
    stage.sum_in_backward = True
    x = torch.randn(4, 128, generator=torch.Generator().manual_seed(4))
    stage.forward(0, (x,), torch.tensor([0, 1, 2, 3]))
    first = stage.backward(0, None, need_input_grads=True)[0].clone()
    stage.forward(1, (x,), torch.tensor([0, 1, 2, 3]))
    again = stage.backward(1, None, need_input_grads=True)[0]
    assert torch.equal(first, again)


def test_a_last_stage_keeps_the_loss_not_its_outputs_for_the_backward():
    """A language model's logits are as large as its loss's saved softmax: holding them too until the
    backward would keep one more such tensor per minibatch in flight."""
    last, middle = _stage(4, 9, False), _stage(2, 6, False)
    last.forward(0, (torch.randn(4, 128),), torch.tensor([0, 1, 2, 3]))
    middle.forward(0, (torch.randn(4, 128),), None)
    assert last.inflight[0].outputs == () and last.inflight[0].loss is not None
    assert len(middle.inflight[0].outputs) == 1


def test_the_memory_model_is_within_a_few_percent_of_an_mlp_stages_allocations():
    """experiments/validation/memory_cpu.py: hetsim.memory against the stage's own CPU allocations."""
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "experiments" / "validation" / "memory_cpu.py"
    spec = importlib.util.spec_from_file_location("memory_cpu", path)
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    kwargs = {"hidden": 512, "depth": 4}
    for nm, optimizer in ((2, "momentum"), (4, "momentum"), (2, "sgd"), (2, "adam")):
        got = check.measured_peak_bytes("mlp", kwargs, 128, nm, optimizer)
        want = check.predicted("mlp", kwargs, 128, nm, optimizer).total_bytes
        assert abs(want - got) / got < 0.08, (nm, optimizer, want, got)
