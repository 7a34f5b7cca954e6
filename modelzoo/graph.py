"""A model as a DAG of layers, split at cuts of a topological order (what profiles and plans use).

`layer_graph(model, example)` traces the model with torch.fx; every traced operation (a module call,
an `add`, a `cat`, a `flatten`) becomes one layer whose inputs are earlier layers' outputs. A stage
of a plan is a contiguous range [lo, hi) of these layers; `run(lo, hi, boundary)` executes it from
the tensors that cross cut `lo` and returns the tensors that cross cut `hi`, so the executor sends
exactly what `hetsim.profile.ModelProfile.cut_bytes` counts.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch
from torch import fx, nn

__all__ = ["LayerGraph", "layer_graph", "MODEL_INPUT", "fp32_nbytes"]

MODEL_INPUT = -1          # the key of the model's input in boundary dicts


class _Call(nn.Module):
    """A traced function or method call as a layer: constants fixed, tensor arguments filled in order."""

    def __init__(self, target: Any, kind: str, args: tuple, kwargs: dict):
        super().__init__()
        self.target, self.call_kind, self.template, self.kwargs_template = target, kind, args, kwargs

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        feed = iter(inputs)
        args = _fill(self.template, feed)
        kwargs = {k: _fill(v, feed) for k, v in self.kwargs_template.items()}
        if self.call_kind == "call_method":
            return getattr(args[0], self.target)(*args[1:], **kwargs)
        return self.target(*args, **kwargs)


class _Slot:
    def __repr__(self) -> str:
        return "<tensor>"


_SLOT = _Slot()


def _fill(template: Any, feed) -> Any:
    """Put the next input tensors into the slots of an argument template (lists included)."""
    if template is _SLOT:
        return next(feed)
    if isinstance(template, (list, tuple)):
        return type(template)(_fill(t, feed) for t in template)
    return template


@dataclass(eq=False)
class LayerGraph:
    """Layers in topological order; `preds[i]` are the layers (or MODEL_INPUT) feeding layer i, in
    argument order. `layers[i]` is an nn.Module called as layers[i](*outputs of preds[i])."""

    names: list[str]
    kinds: list[str]
    preds: list[list[int]]
    layers: nn.ModuleList

    def __len__(self) -> int:
        return len(self.names)

    @property
    def edges(self) -> list[tuple[int, int]]:
        return sorted({(p, i) for i, ps in enumerate(self.preds) for p in ps if p != MODEL_INPUT})

    def crossing(self, cut: int) -> list[int]:
        """Which outputs cross the cut before layer `cut`: MODEL_INPUT for cut 0, the final layer's
        output for cut len(self), else every output made before `cut` and used at or after it."""
        if cut <= 0:
            return [MODEL_INPUT]
        if cut >= len(self):
            return [len(self) - 1]
        last_use: dict[int, int] = {}
        for i, ps in enumerate(self.preds):
            for p in ps:
                last_use[p] = max(last_use.get(p, -2), i)
        return sorted(p for p, use in last_use.items() if p < cut <= use)

    def run(self, lo: int, hi: int, boundary: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
        """Run layers [lo, hi) from the outputs crossing cut lo; return those crossing cut hi."""
        values = dict(boundary)
        for i in range(lo, hi):
            values[i] = self.layers[i](*(values[p] for p in self.preds[i]))
        return {k: values[k] for k in self.crossing(hi)}

    def stage_parameters(self, lo: int, hi: int) -> Iterable[nn.Parameter]:
        for i in range(lo, hi):
            yield from self.layers[i].parameters()

    def param_bytes(self, i: int) -> int:
        """Bytes of layer i's parameters at FP32 (what profiles hold, whatever dtype the layer is in)."""
        return sum(fp32_nbytes(p) for p in self.layers[i].parameters())


def fp32_nbytes(t: torch.Tensor) -> int:
    """Bytes of `t` with floating elements at 4 each, whatever dtype it is in (profiles hold FP32 counts)."""
    return t.numel() * (4 if t.is_floating_point() else t.element_size())


def layer_graph(model: nn.Module, leaf_modules: tuple[type, ...] = ()) -> LayerGraph:
    """Trace `model` into a LayerGraph. `leaf_modules` stay whole (e.g. a transformer block); a model
    may name its own in a `leaf_modules` attribute, so every caller gets the same layers."""
    graph = _Tracer(tuple(leaf_modules) + tuple(getattr(model, "leaf_modules", ()))).trace(model)
    modules = dict(model.named_modules())
    index: dict[fx.Node, int] = {}
    names, kinds, preds, layers = [], [], [], []
    for node in graph.nodes:
        if node.op == "placeholder":
            if index:
                raise ValueError(f"{type(model).__name__}: models with several inputs are not supported")
            index[node] = MODEL_INPUT
        elif node.op == "output":
            if index.get(node.args[0]) != len(names) - 1:
                raise ValueError(f"{type(model).__name__}: the model's output must be its last operation")
        elif node.op == "get_attr":
            raise ValueError(f"{type(model).__name__}: uses {node.target} directly; wrap it in a module")
        else:
            inputs, layer, kind = _layer(node, modules)
            preds.append([index[n] for n in inputs])
            index[node] = len(names)
            names.append(node.name)
            kinds.append(kind)
            layers.append(layer)
    return LayerGraph(names=names, kinds=kinds, preds=preds, layers=nn.ModuleList(layers))


class _Tracer(fx.Tracer):
    def __init__(self, leaves: tuple[type, ...]):
        super().__init__()
        self.leaves = leaves

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, self.leaves) or super().is_leaf_module(m, qualname)


_FUNCTION_KINDS: dict[Callable, str] = {operator.add: "Add", torch.add: "Add", torch.cat: "Cat",
                                        torch.flatten: "Flatten", operator.mul: "Mul"}


def _layer(node: fx.Node, modules: dict[str, nn.Module]) -> tuple[list[fx.Node], nn.Module, str]:
    """The input nodes, the callable layer and its kind name for one traced operation."""
    inputs: list[fx.Node] = []

    def slot(a):
        if isinstance(a, fx.Node):
            inputs.append(a)
            return _SLOT
        if isinstance(a, (list, tuple)):
            return type(a)(slot(x) for x in a)
        return a

    args = tuple(slot(a) for a in node.args)
    kwargs = {k: slot(v) for k, v in node.kwargs.items()}
    if node.op == "call_module":
        module = modules[node.target]
        if kwargs or any(a is not _SLOT for a in args):
            raise ValueError(f"{node.name}: module {node.target} is called with constant arguments")
        return inputs, module, type(module).__name__
    kind = _FUNCTION_KINDS.get(node.target, getattr(node.target, "__name__", str(node.target)))
    return inputs, _Call(node.target, node.op, args, kwargs), kind.capitalize() if kind.islower() else kind
