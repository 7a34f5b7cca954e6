"""One pipeline stage's model state: its layers, weights, optimiser, and stashed weight versions.

An update writes new tensors whenever a forward in flight still uses the current ones (and always
under WSP, which needs the old ones for the change), so a stashed version is just a reference to the
tensors a forward used: the backward of that minibatch differentiates through the same tensors
(PipeDream's weight stashing, SOSP'19 §3.3) at no copying cost, and the gradient is then applied to
the newest weights. With nothing in flight on the current weights an update works in place. Flush schedules accumulate gradients over a wave and
take one step (GPipe / PipeDream-Flush); with `sum_in_backward` autograd adds each weight's gradient
into the wave's sum as it is computed (AccumulateGrad into a preset `.grad`, as frameworks accumulate
into `.grad`), so a minibatch's gradients never exist whole beside the sum.

Zero-bubble schedules split a backward in two (Qi et al., ICLR'24): `backward_input` differentiates
the stage's inputs and every layer's output (torch.autograd.grad with retain_graph, no weight
gradient computed), and `backward_weight`, later, each layer's weights from its output's gradient
alone, so the second pass does only the weight-gradient work and the sum equals one backward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torch.func import functional_call

from executor.optimizer import UpdateRule
from modelzoo.graph import LayerGraph
from modelzoo.tasks import loss as task_loss

__all__ = ["StageModel", "InFlight"]


class _StageModule(nn.Module):
    """Layers [lo, hi) of a graph called with the tensors crossing cut lo, in `crossing` order."""

    def __init__(self, graph: LayerGraph, lo: int, hi: int):
        super().__init__()
        self.layers = graph.layers          # registered, so functional_call can swap their weights
        self.graph, self.lo, self.hi = graph, lo, hi
        self.inputs = graph.crossing(lo)
        self.keep_layer_outputs = False
        self.layer_outputs: list[torch.Tensor | None] = []
        # A split backward's W starts from the outputs of the layers with weights, and only those.
        self.weighted = {i for i in range(lo, hi) if any(True for _ in graph.layers[i].parameters())}

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if not self.keep_layer_outputs:
            out = self.graph.run(self.lo, self.hi, dict(zip(self.inputs, tensors)))
            return tuple(out[k] for k in self.graph.crossing(self.hi))
        # As graph.run, keeping each weighted layer's output for a split backward.
        values = dict(zip(self.inputs, tensors))
        for i in range(self.lo, self.hi):
            values[i] = self.layers[i](*(values[p] for p in self.graph.preds[i]))
        self.layer_outputs = [values[i] if i in self.weighted else None for i in range(self.lo, self.hi)]
        return tuple(values[k] for k in self.graph.crossing(self.hi))


@dataclass
class InFlight:
    version: int                       # id of the weights version the forward used
    weights: list[torch.Tensor]        # that version's tensors (the stash)
    leaves: list[torch.Tensor]         # the weight tensors the forward differentiated through
    inputs: tuple[torch.Tensor, ...]
    outputs: tuple[torch.Tensor, ...]
    loss: torch.Tensor | None
    layer_outputs: list[torch.Tensor | None]   # split backward only: each weighted layer's output
    layer_grads: list[torch.Tensor | None] | None = None   # their gradients, once backward_input ran


class StageModel:
    def __init__(self, graph: LayerGraph, lo: int, hi: int, *, is_last: bool, lr: float, momentum: float,
                 device: torch.device | str = "cpu", loss_fn: Callable = task_loss, optimizer: str = "momentum"):
        for i in range(len(graph)):
            if not lo <= i < hi:
                graph.layers[i] = nn.Identity()          # other stages' weights are not kept here
        graph.layers.to(device)                          # built on the host, so every device starts alike
        self.device = torch.device(device)
        self.module = _StageModule(graph, lo, hi)
        named = [(f"layers.{i}.{n}", p) for i in range(lo, hi)
                 for n, p in graph.layers[i].named_parameters()]
        self.names = [n for n, _ in named]
        self._layer_of = [int(n.split(".")[1]) - lo for n in self.names]    # weight -> layer in the stage
        # The graph's layers keep no weights of their own after this: the stage runs them on its copies.
        self.weights = _take_weights([p for _, p in named])
        self.is_last = is_last
        self.rule = UpdateRule(optimizer, lr=lr, momentum=momentum)     # the plan's optimizer
        self.loss_fn = loss_fn            # modelzoo.tasks' loss, or a tensor-parallel head's (modelzoo.tp)
        self.version = 0                  # bumped whenever the weights change (update, step, pull)
        self._acc: list[torch.Tensor] | None = None       # flush schedules: gradients of the wave
        self._acc_count = 0
        self.sum_in_backward = False      # flush schedules: backward adds into the wave's sum itself
        self.flat_grads = False           # set under BSP: the wave's sum lives in one flat vector
        self._acc_flat: torch.Tensor | None = None
        self._wave_scale = 1.0
        self.inflight: dict[int, InFlight] = {}
        self.grads: dict[int, list[torch.Tensor]] = {}     # asynchronous: per minibatch until UPDATE
        # (mb, version at forward, version the backward used, version current at backward)
        self.versions: list[tuple[int, int, int, int]] = []
        self._ptr_version: dict[int, int] = {}
        self._pool: list[list[torch.Tensor]] = []        # spare weight tensors (see _apply)
        self.track_deltas = False         # set under WSP: updates return their weight changes
        self.peak_versions = 1            # most weight versions alive at once (current + stashes)
        self._mark()

    @property
    def numel(self) -> int:
        return sum(w.numel() for w in self.weights)

    def forward(self, mb: int, inputs: tuple[torch.Tensor, ...], labels: torch.Tensor | None
                ) -> tuple[torch.Tensor, ...]:
        """Run the stage on minibatch `mb`; returns the (detached) tensors to send downstream."""
        leaves = [w.detach().requires_grad_(True) for w in self.weights]
        inputs = tuple(t.requires_grad_(True) if t.is_floating_point() and not t.requires_grad else t
                       for t in inputs)
        outputs = functional_call(self.module, dict(zip(self.names, leaves)), inputs, strict=False)
        loss = self.loss_fn(outputs[0], labels) if self.is_last else None    # per sample or per token
        # The last stage's backward starts from the loss, whose graph keeps what it needs: holding
        # the outputs too (a language model's logits) would keep one more logits-sized tensor per
        # minibatch in flight. (A split backward keeps every weighted layer's output but the head's.)
        kept = () if self.is_last else outputs
        layer_outputs = self.module.layer_outputs
        if self.is_last and layer_outputs:
            # Nor do its weight gradients need the head's output: W starts the head from the loss.
            layer_outputs[-1] = None
        self.inflight[mb] = InFlight(self.version, self.weights, leaves, inputs, kept, loss, layer_outputs)
        self.module.layer_outputs = []
        live = {r.version for r in self.inflight.values()} | {self.version}
        self.peak_versions = max(self.peak_versions, len(live))
        return tuple(o.detach() for o in outputs)

    def backward(self, mb: int, grad_outputs: tuple[torch.Tensor, ...] | None,
                 need_input_grads: bool) -> tuple[torch.Tensor, ...]:
        """Gradients of minibatch `mb` through the weights its forward used (the stash)."""
        rec = self.inflight.pop(mb)
        roots, root_grads = self._roots(rec, grad_outputs)
        inputs = list(rec.inputs) if need_input_grads else []
        if self.sum_in_backward:
            self._preset_sums(rec.leaves, range(len(rec.leaves)))
            for t in inputs:                 # a caller's reused input tensor must not add to its last
                t.grad = None
            torch.autograd.backward(roots, root_grads, inputs=rec.leaves + inputs)
            self._weights_done(mb, rec, None)
            grad_inputs = [t.grad for t in inputs]
        else:
            grads = torch.autograd.grad(roots, rec.leaves + inputs, root_grads, allow_unused=True)
            self._weights_done(mb, rec, grads[:len(rec.leaves)])
            grad_inputs = grads[len(rec.leaves):]
        return _or_zeros(rec.inputs, grad_inputs) if need_input_grads else ()

    def backward_input(self, mb: int, grad_outputs: tuple[torch.Tensor, ...] | None,
                       need_input_grads: bool) -> tuple[torch.Tensor, ...]:
        """Split backward, first half: gradients of the inputs and of each weighted layer's output (kept
        for backward_weight); no weight gradient is computed (autograd runs only what the inputs need)."""
        if not self.split_backward:
            # Without the layer outputs backward_weight would find nothing to differentiate: zero gradients.
            raise RuntimeError("backward_input on a stage built without split_backward = True")
        rec = self.inflight[mb]
        roots, root_grads = self._roots(rec, grad_outputs)
        inputs = list(rec.inputs) if need_input_grads else []
        outs = [i for i, o in enumerate(rec.layer_outputs) if isinstance(o, torch.Tensor) and o.requires_grad]
        grads = torch.autograd.grad(roots, inputs + [rec.layer_outputs[i] for i in outs], root_grads,
                                    retain_graph=True, allow_unused=True)
        rec.layer_grads = [None] * len(rec.layer_outputs)
        for i, g in zip(outs, grads[len(inputs):]):
            rec.layer_grads[i] = g
        return _or_zeros(rec.inputs, grads[:len(inputs)]) if need_input_grads else ()

    def backward_weight(self, mb: int) -> None:
        """Split backward, second half: each layer's weight gradients from its output's gradient, one
        layer at a time, so autograd walks only that layer (never back into the ones before it)."""
        rec = self.inflight.pop(mb)
        grads: list[torch.Tensor | None] = [None] * len(rec.leaves)
        if self.sum_in_backward:            # every leaf, those of layers with no gradient included
            self._preset_sums(rec.leaves, range(len(rec.leaves)))
        head = len(rec.layer_outputs) - 1 if self.is_last else None
        for layer, (out, g) in enumerate(zip(rec.layer_outputs, rec.layer_grads)):
            mine = [j for j, l in enumerate(self._layer_of) if l == layer]
            if layer == head:
                out, g = rec.loss, None           # last, so the loss's graph is not needed after it
            elif g is None:
                continue
            if not mine or out is None:
                continue
            if self.sum_in_backward:
                torch.autograd.backward(out, g, inputs=[rec.leaves[j] for j in mine])
                continue
            for j, grad in zip(mine, torch.autograd.grad(out, [rec.leaves[j] for j in mine], g, allow_unused=True)):
                grads[j] = grad
        self._weights_done(mb, rec, None if self.sum_in_backward else grads)

    @property
    def split_backward(self) -> bool:
        return self.module.keep_layer_outputs

    @split_backward.setter
    def split_backward(self, on: bool) -> None:
        self.module.keep_layer_outputs = on

    def _roots(self, rec: InFlight, grad_outputs):
        """What a backward starts from: the loss on the last stage, else the outputs with their gradients."""
        if self.is_last:
            return [rec.loss], None
        pairs = [(o, g) for o, g in zip(rec.outputs, grad_outputs) if o.requires_grad]
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def _weights_done(self, mb: int, rec: InFlight, grads) -> None:
        """`grads`: the weights' gradients, or None where the backward summed them into the wave's."""
        # Which version the backward differentiated through, read from the tensors themselves.
        used = self._ptr_version.get(rec.leaves[0].data_ptr(), -1) if rec.leaves else rec.version
        self.versions.append((mb, rec.version, used, self.version))
        self._release(rec.version, rec.weights)
        if grads is None:
            self._acc = list(_or_zeros(rec.leaves, [leaf.grad for leaf in rec.leaves]))
        else:
            self._collect(mb, list(_or_zeros(rec.leaves, grads)))

    def _preset_sums(self, leaves: list[torch.Tensor], which) -> None:
        """Point the `.grad` of leaves `which` at the wave's sum, for autograd to add into in place.
        The wave's first minibatch finds none (autograd's fresh tensors become the sum) unless the sum
        lives in the flat vector, which then starts at zero."""
        if self._acc is None and self.flat_grads:
            if self._acc_flat is None:
                self._acc_flat = torch.empty(sum(w.numel() for w in self.weights), device=self.device)
            self._acc_flat.zero_()
            self._acc = _views(self._acc_flat, self.weights)
        if self._acc is not None:
            for j in which:
                leaves[j].grad = self._acc[j]

    def _collect(self, mb: int, grads: list[torch.Tensor]) -> None:
        self.grads[mb] = grads

    def loss_of(self, mb: int) -> float | None:
        rec = self.inflight.get(mb)
        return None if rec is None or rec.loss is None else float(rec.loss.detach())

    def accumulate(self, mb: int) -> None:
        """Flush schedules: add minibatch `mb`'s gradients to the wave's sum (with `sum_in_backward`
        its backward did, and this only counts it)."""
        if self.sum_in_backward:
            self._acc_count += 1
            return
        grads = self.grads.pop(mb)
        if self._acc is None and self.flat_grads:
            # One vector the all-reduce works on in place (no concatenation per wave), reused.
            if self._acc_flat is None:
                self._acc_flat = torch.empty(sum(g.numel() for g in grads), device=self.device)
            self._acc = _views(self._acc_flat, grads)
            for a, g in zip(self._acc, grads):
                a.copy_(g)
        elif self._acc is None:
            self._acc = grads                 # autograd's fresh tensors: ours to add into
        else:
            for a, g in zip(self._acc, grads):
                a.add_(g)
        self._acc_count += 1

    def update(self, mb: int) -> list[torch.Tensor]:
        """Asynchronous schedules: apply minibatch `mb`'s gradients to the newest weights.
        Returns the change of every weight tensor."""
        return self._apply(self.grads.pop(mb))

    def step(self) -> list[torch.Tensor]:
        """Flush schedules: one step with the mean gradient of the wave; returns the weight changes."""
        grads, scale = self._acc, self._wave_scale / self._acc_count
        self._acc, self._acc_count, self._wave_scale = None, 0, 1.0
        return self._apply(grads, scale)

    def wave_flat(self) -> torch.Tensor:
        """BSP: the wave's gradient sum as one vector (`flat_grads`), to all-reduce in place."""
        if self._acc is None or self._acc_flat is None:
            return torch.zeros(0, device=self.device)
        return self._acc_flat

    def scale_wave(self, factor: float) -> None:
        """Multiply the wave's gradients by `factor` at the step (an all-reduce's 1/n, for free)."""
        self._wave_scale = factor

    def _apply(self, grads: list[torch.Tensor], scale: float = 1.0) -> list[torch.Tensor]:
        """One step of the stage's optimizer (`executor.optimizer`) with gradients scale x grads (a
        flush step's mean over the wave).

        The new weights go into fresh tensors when a stashed minibatch still uses the current ones
        (taken from versions no longer used, so large updates do not allocate), else in place."""
        stashed = any(r.version == self.version for r in self.inflight.values())
        # Under WSP the old weights are needed for the change, so new ones go elsewhere too.
        fresh = stashed or self.track_deltas
        target = (self._pool.pop() if self._pool else [torch.empty_like(w) for w in self.weights]) \
            if fresh else self.weights
        deltas = []
        self.rule.begin(len(self.weights))
        for i, (w, g) in enumerate(zip(self.weights, grads)):
            self.rule.apply(i, w, g, scale, target[i])
            if self.track_deltas:           # WSP pushes exactly what changed (the update rounds)
                deltas.append(target[i] - w)
        if fresh and not stashed and len(self._pool) < 2:
            self._pool.append(self.weights)  # nothing in flight uses the old weights
        self.weights = target
        self.version += 1
        self._mark()
        return deltas

    def _release(self, version: int, weights: list[torch.Tensor]) -> None:
        """A stashed version no forward in flight uses any more becomes a buffer for the next one."""
        if version != self.version and all(r.version != version for r in self.inflight.values()):
            if len(self._pool) < 2:
                self._pool.append(weights)

    def flat(self) -> torch.Tensor:
        return torch.cat([w.reshape(-1) for w in self.weights]) if self.weights else torch.zeros(0, device=self.device)

    def set_flat(self, flat: torch.Tensor) -> None:
        """New weights from `flat`, which becomes ours: the weights are views into it, not copies."""
        self.weights = _views(flat, self.weights)
        self.version += 1
        self._mark()

    def _mark(self) -> None:
        """Remember which version the current weight tensors are (stashes keep old ones alive)."""
        if len(self._ptr_version) > 4 * (len(self.inflight) + 2):
            keep = {r.leaves[0].data_ptr() for r in self.inflight.values() if r.leaves}
            self._ptr_version = {p: v for p, v in self._ptr_version.items() if p in keep}
        if self.weights:
            self._ptr_version[self.weights[0].data_ptr()] = self.version


def _take_weights(params: list[nn.Parameter]) -> list[torch.Tensor]:
    """A plain copy of each parameter, the parameter's own storage freed right after it is copied:
    forward swaps the copies in (functional_call), so keeping both would hold every weight twice on
    the device (and copying all before freeing any, for a moment). Parameters sharing a storage (one
    listed twice) each get their own copy, as the stage trains them apart."""
    sharing: dict[int, list[int]] = {}
    for i, p in enumerate(params):
        sharing.setdefault(p.untyped_storage().data_ptr(), []).append(i)
    out: list[torch.Tensor] = [torch.empty(0)] * len(params)
    for members in sharing.values():
        for i in members:
            out[i] = params[i].detach().clone()
        try:
            params[members[0]].untyped_storage().resize_(0)
        except RuntimeError:        # a storage that cannot be resized (shared memory, numpy's): kept
            pass
    return out


def _or_zeros(like, grads) -> tuple[torch.Tensor, ...]:
    """Autograd's None (no path) as zeros shaped like the tensor it is the gradient of."""
    return tuple(torch.zeros_like(t) if g is None else g for t, g in zip(like, grads))


def _views(flat: torch.Tensor, like: list[torch.Tensor]) -> list[torch.Tensor]:
    """Consecutive pieces of `flat` shaped as the tensors in `like`."""
    out, offset = [], 0
    for t in like:
        out.append(flat[offset:offset + t.numel()].view_as(t))
        offset += t.numel()
    return out
