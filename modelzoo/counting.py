"""Per-layer operation and memory-traffic counts, taken on the meta device (no data, no time).

    costs = count_model("resnet50", batch=32)       # list[hetsim.derive.LayerCost], layer order

FLOPs come from torch.utils.flop_counter, which counts a multiply-add as 2 FLOPs and counts only
matrix products and convolutions (elementwise work, normalisation and pooling count 0), the
convention of published model counts (VGG-16: 15.5 G multiply-adds = 31 GFLOPs per 224x224 image).
Bytes are what eager execution moves: for every aten operation a layer runs, the bytes of its tensor
inputs and outputs (views move nothing and are skipped), summed. Backward counts come from running
the layer's autograd backward under the same counters, with the same detached-input method as the
profiler (modelzoo.profiler), so a layer's backward includes its input and weight gradients only.
What each layer saves for backward, and its tensor-parallel shares, come from modelzoo.saved, which
runs the forward once more with CUDA's attention, dropout and RMSNorm kernels.
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import FlopCounterMode

from hetsim.derive import LayerCost
from hetsim.errors import HetsimError
from hetsim.profile import LayerProfile, ModelProfile
from modelzoo import MODEL_INPUT, LayerGraph, build, layer_graph
from modelzoo.attention import counted_attention
from modelzoo.saved import count_saved
from modelzoo.tasks import task_of

__all__ = ["count_model", "count_graph", "counted_profile", "meta_loss", "with_counts", "COUNTED_FIELDS"]


class _ByteCounter(TorchDispatchMode):
    """Adds up the bytes of tensor inputs and outputs of every non-view aten operation."""

    def __init__(self):
        super().__init__()
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
            self.bytes += sum(t.numel() * t.element_size() for t in tensors)
        return out


def count_model(model: str, batch: int, *, attention: str = "fused", **model_kwargs) -> list[LayerCost]:
    """Counts for every layer of a modelzoo model at `batch` (built on the meta device), attention
    counted `attention` (modelzoo.attention: "fused" as PyTorch runs it on a GPU, or "materialized")."""
    module, example = build(model, batch=batch, device="meta", **model_kwargs)
    return count_graph(layer_graph(module), example, attention=attention)


def counted_profile(model: str, batch: int, *, attention: str = "fused",
                    **model_kwargs) -> tuple[ModelProfile, list[LayerCost]]:
    """A profile with every layer's kind, parameter, output and saved bytes (with their tensor-parallel
    shares), FLOPs and edges but no times yet (add them with hetsim.derive.derive_profile), and the
    counts to derive them from, attention counted `attention` (see count_model)."""
    module, example = build(model, batch=batch, device="meta", **model_kwargs)
    graph = layer_graph(module)
    outputs: list[int] = []
    costs = count_graph(graph, example, output_bytes=outputs, attention=attention)
    saved = count_saved(graph, example, loss=meta_loss(module, example), attention=attention)
    layers = tuple(LayerProfile(name=graph.names[i], kind=graph.kinds[i], param_bytes=graph.param_bytes(i),
                                output_bytes=outputs[i], fwd_s={}, bwd_s={}, flops_fwd=costs[i].flops_fwd,
                                saved_bytes=saved[i].saved_bytes,
                                saved_replicated_bytes=saved[i].replicated_bytes,
                                tp_allreduce_bytes=saved[i].tp_allreduce_bytes,
                                tp_allreduce_calls=saved[i].tp_allreduce_calls,
                                tp_allreduce_bwd_bytes=saved[i].tp_allreduce_bwd_bytes,
                                tp_allreduce_bwd_calls=saved[i].tp_allreduce_bwd_calls,
                                saved_shared_bytes=saved[i].shared_bytes,
                                saved_shared_earlier=saved[i].shared_earlier,
                                saved_nonfloat_bytes=saved[i].nonfloat_bytes)
                   for i in range(len(graph)))
    shape = "x".join(map(str, example.shape[1:]))
    return ModelProfile(model=model, batch_size=batch, layers=layers, edges=tuple(graph.edges),
                        input_bytes=example.numel() * example.element_size(),
                        tokens_per_sample=task_of(module, example).tokens_per_sample,
                        tp_divisor=heads_divisor(module),
                        source=f"{model}{_kwargs_text(model_kwargs)}, input {shape} per sample; counted by "
                               "modelzoo.counting on the meta device"), costs


def heads_divisor(module: torch.nn.Module) -> int | None:
    """The greatest common divisor of every attention block's heads and key/value heads (what a
    tensor-parallel degree must divide: Megatron splits whole heads), or None for a model without."""
    counts = [n for m in module.modules() for n in (getattr(m, "n_head", None), getattr(m, "n_kv_head", None))
              if isinstance(n, int)]
    return math.gcd(*counts) if counts else None


COUNTED_FIELDS = ("saved_bytes", "saved_replicated_bytes", "saved_shared_bytes", "saved_shared_earlier",
                  "saved_nonfloat_bytes", "tp_allreduce_bytes",
                  "tp_allreduce_calls", "tp_allreduce_bwd_bytes", "tp_allreduce_bwd_calls")


def with_counts(profile: ModelProfile, counted: ModelProfile) -> ModelProfile:
    """`profile` (measured: times only) with `counted`'s saved and tensor-parallel bytes per layer
    (counted_profile's), which timing layers does not give: the memory prediction and a TP stage's
    all-reduces need them."""
    if counted.n_layers != profile.n_layers:
        raise HetsimError(f"profile: {profile.n_layers} layers, but {counted.model} has {counted.n_layers}; "
                          f"give a profile of {counted.model}")
    layers = tuple(replace(l, **{f: getattr(c, f) for f in COUNTED_FIELDS})
                   for l, c in zip(profile.layers, counted.layers))
    return replace(profile, layers=layers, tp_divisor=counted.tp_divisor,
                   source=profile.source + " + saved and TP all-reduce bytes counted by modelzoo.saved")


def meta_loss(module, example: torch.Tensor) -> tuple:
    """The model's training loss and a minibatch of labels on `example`'s device (for count_saved)."""
    from modelzoo.tasks import loss, task_of
    labels = task_of(module, example).random_batch(int(example.shape[0]), torch.Generator().manual_seed(0))[1]
    return loss, labels.to(example.device)


def _kwargs_text(kwargs: dict) -> str:
    return f" ({', '.join(f'{k}={v}' for k, v in sorted(kwargs.items()))})" if kwargs else ""


def count_graph(graph: LayerGraph, example: torch.Tensor, *, output_bytes: list[int] | None = None,
                attention: str = "fused") -> list[LayerCost]:
    """Counts for every layer of `graph` on `example`'s device (use meta: nothing is computed), attention
    counted `attention` (see count_model). Appends each layer's output bytes to `output_bytes` when given."""
    with counted_attention(attention):
        return _count_graph(graph, example, output_bytes)


def _count_graph(graph: LayerGraph, example: torch.Tensor, output_bytes: list[int] | None) -> list[LayerCost]:
    graph.layers.train()
    leaves: dict[int, torch.Tensor] = {MODEL_INPUT: example}
    forward = []
    for i in range(len(graph)):
        inputs = [leaves[p] for p in graph.preds[i]]
        flops, traffic, out = _counted(lambda: graph.layers[i](*inputs))
        forward.append((flops, traffic, out))
        if output_bytes is not None:
            output_bytes.append(out.numel() * out.element_size())
        detached = out.detach()
        leaves[i] = detached.requires_grad_(True) if detached.is_floating_point() else detached
    costs = []
    for i, (flops, traffic, out) in enumerate(forward):
        if isinstance(out, torch.Tensor) and out.requires_grad:
            grad = torch.ones_like(out)
            b_flops, b_traffic, _ = _counted(lambda: torch.autograd.backward(out, grad))
        else:
            b_flops, b_traffic = 0, 0
        costs.append(LayerCost(kind=graph.kinds[i], flops_fwd=float(flops), flops_bwd=float(b_flops),
                               bytes_fwd=float(traffic), bytes_bwd=float(b_traffic)))
    return costs


def _counted(fn):
    flops, traffic = FlopCounterMode(display=False), _ByteCounter()
    with flops, traffic:
        out = fn()
    return flops.get_total_flops(), traffic.bytes, out
