"""A stage's update rule is torch.optim's arithmetic, step for step, in place or into fresh tensors."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from exec_helpers import mlp_plan
from executor.optimizer import UpdateRule, plan_optimizer
from hetsim.errors import PlanError


def torch_optimizer(name: str, params, lr: float):
    return {"sgd": lambda: torch.optim.SGD(params, lr=lr),
            "momentum": lambda: torch.optim.SGD(params, lr=lr, momentum=0.9),
            "adam": lambda: torch.optim.Adam(params, lr=lr),
            "adamw": lambda: torch.optim.AdamW(params, lr=lr)}[name]()


@pytest.mark.parametrize("in_place", [True, False])
@pytest.mark.parametrize("name", ["sgd", "momentum", "adam", "adamw"])
def test_steps_equal_torch_optim(name, in_place):
    gen = torch.Generator().manual_seed(0)
    start = [torch.randn(5, 3, generator=gen), torch.randn(7, generator=gen)]
    theirs = [w.clone().requires_grad_(True) for w in start]
    opt = torch_optimizer(name, theirs, lr=0.01)
    rule, ours = UpdateRule(name, lr=0.01, momentum=0.9), [w.clone() for w in start]
    for step in range(5):
        sums = [torch.randn(w.shape, generator=gen) for w in start]
        scale = 1.0 if step % 2 else 0.25                  # a flush step's mean of 4 minibatches
        for w, g in zip(theirs, sums):
            w.grad = g * scale
        opt.step()
        rule.begin(len(ours))
        targets = ours if in_place else [torch.empty_like(w) for w in ours]
        for i, (w, g) in enumerate(zip(ours, sums)):
            rule.apply(i, w, g, scale, targets[i])
        ours = targets
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a, b.detach(), rtol=1e-6, atol=1e-7)
    assert sum(t is not None for t in rule.state) == (0 if name == "sgd" else 2)
    assert {len(t) for t in rule.state if t is not None} <= {1 if name == "momentum" else 2}


def test_a_restored_state_continues_as_if_never_stopped():
    w, g = torch.ones(4), torch.full((4,), 0.5)
    rule = UpdateRule("adam", lr=0.1)
    for _ in range(3):
        rule.begin(1)
        rule.apply(0, w, g, 1.0, w)
    again = UpdateRule("adam", lr=0.1)
    again.load_state_dict(copy.deepcopy(rule.state_dict()))     # as a checkpoint file holds it
    twin = w.clone()
    for r, x in ((rule, w), (again, twin)):
        r.begin(1)
        r.apply(0, x, g, 1.0, x)
    torch.testing.assert_close(w, twin, rtol=0, atol=0)
    with pytest.raises(PlanError, match="checkpoint: optimizer adam, this run's is sgd"):
        UpdateRule("sgd", lr=0.1).load_state_dict(rule.state_dict())


def test_a_plan_names_its_optimizer_or_gives_copies_the_executor_can_read():
    plan = mlp_plan([[0, 9]], nm=1, schedule="1f1b")
    assert plan_optimizer(plan) == "momentum"
    assert plan_optimizer(replace(plan, optimizer_state_copies=0)) == "sgd"
    assert plan_optimizer(replace(plan, optimizer="adamw", optimizer_state_copies=0)) == "adamw"
    with pytest.raises(PlanError, match="optimizer_state_copies 2: .* set optimizer"):
        plan_optimizer(replace(plan, optimizer_state_copies=2))


def test_a_checkpoint_written_before_other_optimizers_resumes_with_its_momentum_buffers():
    from types import SimpleNamespace

    import modelzoo
    from executor.stage import StageModel
    from executor.worker import _restore
    graph = lambda: modelzoo.layer_graph(modelzoo.build("mlp", batch=1)[0])
    model = StageModel(graph(), 0, 9, is_last=True, lr=0.1, momentum=0.9)
    bufs = [torch.full_like(w, 0.5) for w in model.weights]
    legacy = lambda: {"weights": model.weights, "momentum": bufs, "version": 3, "applied": 7}
    runner = SimpleNamespace(model=model, applied=0)
    _restore(runner, legacy())
    assert [s[0] for s in model.rule.state] == bufs and runner.applied == 7 and model.version == 3
    adam = SimpleNamespace(model=StageModel(graph(), 0, 9, is_last=True, lr=0.1, momentum=0.9, optimizer="adam"),
                           applied=0)
    with pytest.raises(PlanError, match="checkpoint: optimizer momentum, this run's is adam"):
        _restore(adam, legacy())
