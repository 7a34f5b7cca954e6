"""The update rule a stage applies to its weights: the plan's optimizer, as torch.optim computes it.

A stage keeps its own weight tensors and writes an update either in place or into fresh tensors (a
stashed minibatch may still use the old ones), so it cannot hand them to a torch.optim optimizer;
this module is the same arithmetic on tensors given one at a time. State per weight, which is what
hetsim.memory counts as optimizer state: sgd none, momentum one buffer, adam/adamw two
(exp_avg, exp_avg_sq), all lazily made at the first update, as torch.optim makes them.
"""

from __future__ import annotations

import math

import torch

from hetsim.errors import PlanError
from hetsim.plan import OPTIMIZERS, Plan

__all__ = ["UpdateRule", "plan_optimizer", "default_lr"]

# torch.optim's defaults, but for plain SGD's learning rate, which torch leaves to the user.
_DEFAULT_LR = {"sgd": 0.05, "momentum": 0.05, "adam": 1e-3, "adamw": 1e-3}
_BETAS, _EPS, _ADAMW_DECAY = (0.9, 0.999), 1e-8, 1e-2


def default_lr(optimizer: str) -> float:
    return _DEFAULT_LR[optimizer]


def plan_optimizer(plan: Plan) -> str:
    """The optimizer a plan trains with: its `optimizer`, or for a plan that gives only
    `optimizer_state_copies`, SGD (0 copies) or SGD with momentum (1)."""
    if plan.optimizer is not None:
        return plan.optimizer
    by_copies = {0: "sgd", 1: "momentum"}
    if plan.optimizer_state_copies not in by_copies:
        raise PlanError(f"plan {plan.name}: optimizer_state_copies {plan.optimizer_state_copies}: the executor "
                        f"trains a named optimizer; set optimizer ({', '.join(OPTIMIZERS)})")
    return by_copies[plan.optimizer_state_copies]


class UpdateRule:
    """One stage's optimizer: `begin()` once per update, then `apply(i, w, g, out)` for every weight i."""

    def __init__(self, optimizer: str, *, lr: float, momentum: float = 0.9):
        if optimizer not in OPTIMIZERS:
            raise PlanError(f"optimizer {optimizer!r}: choose from {', '.join(OPTIMIZERS)}")
        self.optimizer, self.lr, self.momentum = optimizer, lr, momentum
        self.steps = 0
        self.state: list[tuple[torch.Tensor, ...] | None] = []

    def begin(self, n_weights: int) -> None:
        if len(self.state) < n_weights:
            self.state += [None] * (n_weights - len(self.state))
        self.steps += 1

    def apply(self, i: int, w: torch.Tensor, g: torch.Tensor, scale: float, out: torch.Tensor) -> None:
        """Write weight i's new value into `out` (which may be `w` itself) from its gradient sum `g`
        times `scale` (a flush step's 1/n)."""
        if self.optimizer == "sgd":
            torch.add(w, g, alpha=-self.lr * scale, out=out)
        elif self.optimizer == "momentum":
            self._momentum(i, w, g, scale, out)
        else:
            self._adam(i, w, g, scale, out)

    def _momentum(self, i, w, g, scale, out) -> None:
        # torch.optim.SGD, dampening 0: the first buffer is the gradient itself.
        if self.state[i] is None:
            self.state[i] = (g.clone() if scale == 1.0 else g * scale,)
        else:
            self.state[i][0].mul_(self.momentum).add_(g, alpha=scale)
        torch.add(w, self.state[i][0], alpha=-self.lr, out=out)

    def _adam(self, i, w, g, scale, out) -> None:
        if self.state[i] is None:
            self.state[i] = (torch.zeros_like(w), torch.zeros_like(w))
        exp_avg, exp_avg_sq = self.state[i]
        b1, b2 = _BETAS
        g = g * scale if scale != 1.0 else g
        exp_avg.lerp_(g, 1 - b1)
        exp_avg_sq.mul_(b2).addcmul_(g, g, value=1 - b2)
        step_size = self.lr / (1 - b1 ** self.steps)
        denom = (exp_avg_sq.sqrt() / math.sqrt(1 - b2 ** self.steps)).add_(_EPS)
        if self.optimizer == "adamw":                 # decoupled decay, applied before the step
            torch.mul(w, 1 - self.lr * _ADAMW_DECAY, out=out)
            out.addcdiv_(exp_avg, denom, value=-step_size)
        else:
            torch.addcdiv(w, exp_avg, denom, value=-step_size, out=out)

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer, "steps": self.steps, "state": self.state}

    def load_state_dict(self, saved: dict) -> None:
        if saved["optimizer"] != self.optimizer:
            raise PlanError(f"checkpoint: optimizer {saved['optimizer']}, this run's is {self.optimizer}")
        self.steps, self.state = saved["steps"], list(saved["state"])
