"""Per-kernel-class work of composite layers (a transformer block), counted on the meta device.

hetsim.derive times a layer by one roofline per kernel class of its work (LayerCost.parts): matrix
products, attention, pointwise and norms run at different fractions of a GPU's peak. This module
splits modelzoo.counting's per-layer totals of those layers by aten operation.
"""

from __future__ import annotations

import torch

from hetsim.derive import cost_from_ops
from modelzoo import MODEL_INPUT, build, layer_graph
from modelzoo.attention import check_attention, counted_attention

__all__ = ["split_by_kernel_class", "COMPOSITE_KINDS"]

# Layer kinds whose derived time is the sum of one roofline per kernel class of their work.
COMPOSITE_KINDS = ("Block",)


def split_by_kernel_class(model: str, batch: int, costs: list, *, attention: str = "fused", **model_kwargs) -> list:
    """`costs` (modelzoo.counting's, same model, batch and `attention`) with each COMPOSITE_KINDS layer's
    work split by kernel class (hetsim.derive.LayerCost.parts): counted per aten operation on the meta
    device, the way modelzoo.counting counts the layer (detached input, backward from a ones gradient),
    attention counted `attention` (modelzoo.attention)."""
    check_attention(attention)
    if not any(c.kind in COMPOSITE_KINDS for c in costs):
        return costs
    module, example = build(model, batch=batch, device="meta", **model_kwargs)
    graph = layer_graph(module)
    graph.layers.train()
    outputs, split, out = {MODEL_INPUT: example}, {}, []
    for i, cost in enumerate(costs):
        inputs = [outputs[p] for p in graph.preds[i]]
        if cost.kind in COMPOSITE_KINDS:
            if cost not in split:                   # identical blocks are counted once
                with counted_attention(attention):
                    split[cost] = _counted_by_op(graph.layers[i], inputs, cost.kind)
            cost = split[cost]
        with torch.no_grad():
            outputs[i] = graph.layers[i](*inputs)
        out.append(cost)
    return out


def _counted_by_op(layer, inputs: list, kind: str):
    leaves = [x.detach().requires_grad_(x.is_floating_point()) for x in inputs]
    fwd, y = _op_counts(lambda: layer(*leaves))
    grad = torch.ones_like(y)
    bwd, _ = _op_counts(lambda: torch.autograd.backward(y, grad))
    return cost_from_ops(kind, fwd, bwd)


def _op_counts(fn) -> tuple[dict[str, tuple[float, float]], object]:
    """(FLOPs, bytes) per aten operation name while `fn` runs, counted as modelzoo.counting counts."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torch.utils.flop_counter import FlopCounterMode

    class BytesByOp(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.bytes: dict[str, int] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            if not func.is_view:
                tensors = [t for t in tree_flatten((args, kwargs, result))[0] if isinstance(t, torch.Tensor)]
                name = _op_name(func.overloadpacket)
                self.bytes[name] = self.bytes.get(name, 0) + sum(t.numel() * t.element_size() for t in tensors)
            return result

    flops, moved = FlopCounterMode(display=False), BytesByOp()
    with flops, moved:
        result = fn()
    counted = {_op_name(op): n for op, n in flops.get_flop_counts()["Global"].items()}
    ops = sorted(set(counted) | set(moved.bytes))
    return {op: (float(counted.get(op, 0)), float(moved.bytes.get(op, 0))) for op in ops}, result


def _op_name(packet) -> str:
    return str(packet).rsplit(".", 1)[-1]                 # "aten.addmm" -> "addmm"

