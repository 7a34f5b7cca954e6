"""What autograd keeps for the backward pass, per layer and minibatch, counted on the meta device.

    saved = count_saved(graph, example)      # list[SavedBytes], layer order

Each layer's forward runs under `torch.autograd.graph.saved_tensors_hooks`; every distinct storage a
saved tensor lives in counts once, in whole (Q, K and V are views of one QKV product: one storage).
The layer's own parameters and buffers are not activations and are left out. A tensor that two
consecutive layers save (a ReLU's output that the next convolution saves as its input) counts in both,
and `shared_bytes` of the second says how much, so a stage holding both counts it once; a layer's output
that layers further on save too (the input of an Inception module, which each branch's first
convolution saves) is in `shared_earlier` of each of them, with the nearest earlier layer saving it.
`nonfloat_bytes` are the integer and boolean storages kept whole under TP (max-pool indices, dropout
masks), which keep their size when training at 16 bits.

Counted as CUDA runs the layer, not as CPU or meta would (a training GPU is what the count is for):

- F.scaled_dot_product_attention: meta runs the math path, which keeps the s x s probabilities; CUDA
  (and CPU, without a mask) run a fused kernel that keeps Q, K, V, the output and a logsumexp.
- F.dropout: CPU and meta keep a full-width float mask; CUDA's native_dropout a 1-byte mask.
- F.rms_norm: CPU and meta run a composite that also keeps the normalised input; CUDA's fused kernel
  keeps the input and 1/rms.

tests/modelzoo/test_saved.py shows each difference.

Tensor parallelism (Megatron-LM, Shoeybi et al. 2019, section 3): each layer is followed through the
products with its weights. A product whose other operand is whole is column-parallel and splits its
output 1/t (QKV, the MLP's first product); one whose operand is split is row-parallel and all-reduces
its output, whole again (attention's output projection, the MLP's second product); every other
operation's output is split when one of its inputs is. A lookup of the token ids the layer receives is
vocab-parallel and all-reduced too. Backward, the gradient of each whole tensor that column-parallel
products take is all-reduced, once per tensor (a block's norm outputs; the head's input), unless it
needs no gradient (the model's input) or the layer's output stays split (no pair closes in it); a
loss after a split last layer is vocabulary-parallel and all-reduces forward, as modelzoo.tp's does,
each row's maximum, then its exponential sum and target score (two calls; Megatron's makes three, as
hetsim.transformer counts). `replicated_bytes` are the saved storages that stay whole: in a
transformer block the norms' inputs, the QKV and first MLP products' inputs and the dropout masks:
the 10sbh of Korthikanti et al. 2022's sbh(10 + 24/t + 5as/ht) bytes per member at 16 bits.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import chain
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from modelzoo.attention import check_attention
from modelzoo.graph import MODEL_INPUT, LayerGraph

__all__ = ["SavedBytes", "count_saved", "layer_saved"]

aten = torch.ops.aten


@dataclass(frozen=True)
class SavedBytes:
    """One layer, one minibatch: what autograd keeps, the part a TP member keeps whole, and what one
    forward all-reduces inside a TP group, in how many calls."""

    saved_bytes: int
    replicated_bytes: int
    tp_allreduce_bytes: int
    shared_bytes: int = 0        # of saved_bytes, what the layer before it saves too (its output)
    shared_earlier: tuple[tuple[int, int], ...] = ()   # of saved_bytes, (layer further back, bytes) it saves too
    nonfloat_bytes: int = 0      # of saved_bytes, integer and boolean storages kept whole under TP
    tp_allreduce_calls: int = 0
    tp_allreduce_bwd_bytes: int = 0    # what one backward all-reduces, in how many calls
    tp_allreduce_bwd_calls: int = 0


def count_saved(graph: LayerGraph, example: torch.Tensor,
                loss: tuple[Callable, torch.Tensor] | None = None, attention: str = "fused") -> list[SavedBytes]:
    """Saved bytes of every layer of `graph` on `example` (use the meta device: nothing is computed).
    Each layer gets its predecessors' outputs as fresh leaves, as a pipeline stage receives them.
    With `loss` (the loss function and labels on the same device) the last layer's count includes
    what the loss saves (a cross-entropy's log-softmax: as large as the scores), as a measured last
    layer's times include the loss; under TP it is split, as a vocabulary-parallel loss splits it.
    `attention` "materialized" counts attention as its math path runs it, keeping the s x s
    probabilities (Megatron-LM's core attention at attention dropout 0), as hetsim.derive then times it."""
    check_attention(attention)
    graph.layers.train()
    values: dict[int, torch.Tensor] = {MODEL_INPUT: example}
    # The last layer to save each layer output (values stay alive, so their keys are never reused).
    last_saver: dict[int, int] = {_key(example): -1}
    counts, before, last_split = [], {}, False
    for i, layer in enumerate(graph.layers):
        count, out, storages, last_split = _layer_saved(layer, [values[p] for p in graph.preds[i]],
                                                        fused_attention=attention == "fused")
        if last_split and i < len(graph) - 1:
            # Its output stays split: no Megatron pair closes inside the layer (modelzoo.tp refuses such
            # layers), so no gradient all-reduce opens one either.
            count = replace(count, tp_allreduce_bwd_bytes=0, tp_allreduce_bwd_calls=0)
        shared = sum(s.nbytes() for k, s in storages.items() if k in before)
        counts.append(replace(count, shared_bytes=shared,
                              shared_earlier=_shared_earlier(i, storages, last_saver)))
        # A detached output shares its storage with the next layer's input. Holding the layer's saved
        # storages until the next is counted keeps their addresses (the keys) from being reused by
        # the next layer's new storages, which would count as shared what is not.
        before = storages
        out = out.detach()
        values[i] = out.requires_grad_(True) if out.is_floating_point() else out
        last_saver.setdefault(_key(values[i]), i if _key(values[i]) in storages else -1)
    if loss is not None and counts:
        scores = values[len(graph) - 1]
        extra = _loss_saved(*loss, scores, before)
        counts[-1] = replace(counts[-1], saved_bytes=counts[-1].saved_bytes + extra)
        if last_split:
            counts[-1] = _with_parallel_loss(counts[-1], scores)
    return counts


def _shared_earlier(i: int, storages: dict, last_saver: dict[int, int]) -> tuple[tuple[int, int], ...]:
    """(j, bytes) of the layer outputs layer i saves that layer j < i - 1 saved last; records i as
    their last saver."""
    far: dict[int, int] = {}
    for k, storage in storages.items():
        if k in last_saver:
            j, last_saver[k] = last_saver[k], i
            if 0 <= j < i - 1:
                far[j] = far.get(j, 0) + storage.nbytes()
    return tuple(sorted(far.items()))


def _with_parallel_loss(count: SavedBytes, scores: torch.Tensor) -> SavedBytes:
    """Scores split by class over a TP group take modelzoo.tp's vocabulary-parallel cross-entropy:
    forward, an all-reduce of each row's maximum, then one of its exponential sum and target score."""
    rows = scores.numel() // scores.shape[-1]
    return replace(count, tp_allreduce_bytes=count.tp_allreduce_bytes + 3 * rows * scores.element_size(),
                   tp_allreduce_calls=count.tp_allreduce_calls + 2)


def _loss_saved(fn: Callable, labels: torch.Tensor, scores: torch.Tensor, counted: dict) -> int:
    """Bytes the loss saves for its backward beyond the storages the last layer saved (`counted`).
    Scalars (a mean's divisor) are left out: a few bytes that, unlike the rest, do not grow with the
    batch, which would break a profile's scaling to other batches."""
    saved: dict[int, torch.UntypedStorage] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        k = _key(t)
        if t.dim() > 0 and k not in counted and k not in saved:
            saved[k] = t.untyped_storage()
        return t

    with _AsOnCuda(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(scores, labels)
    return sum(s.nbytes() for s in saved.values())


def layer_saved(layer: nn.Module, inputs: list[torch.Tensor]) -> tuple[SavedBytes, torch.Tensor]:
    """Run `layer(*inputs)` once, counting what it saves; the output comes back, its graph alive."""
    count, out, _storages, _split = _layer_saved(layer, inputs)
    return count, out


def _layer_saved(layer: nn.Module, inputs: list[torch.Tensor], fused_attention: bool = True):
    weights = {_key(t) for t in chain(layer.parameters(), layer.buffers())}
    tp = _TensorParallel(weights, {_key(t) for t in inputs})
    saved: dict[int, tuple[torch.UntypedStorage, bool]] = {}
    nonfloat: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        k = _key(t)
        if k not in weights and k not in saved:
            saved[k] = (t.untyped_storage(), k not in tp.split)
            if not (t.is_floating_point() or t.is_complex()):
                nonfloat.add(k)
        return t

    with _AsOnCuda(fused_attention), tp, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = layer(*inputs)
    total = sum(s.nbytes() for s, _ in saved.values())
    whole = sum(s.nbytes() for s, replicated in saved.values() if replicated)
    fixed = sum(s.nbytes() for k, (s, replicated) in saved.items() if replicated and k in nonfloat)
    storages = {k: s for k, (s, _replicated) in saved.items()}
    count = SavedBytes(saved_bytes=total, replicated_bytes=whole, nonfloat_bytes=fixed,
                       tp_allreduce_bytes=tp.allreduce_bytes,
                       tp_allreduce_calls=tp.allreduce_calls, tp_allreduce_bwd_bytes=tp.bwd_bytes,
                       tp_allreduce_bwd_calls=len(tp.copied))
    split = isinstance(out, torch.Tensor) and _key(out) in tp.split
    return count, out, storages, split


def _key(t: torch.Tensor) -> int:
    # Storage identity: meta tensors have no data pointer, so the address of the storage itself stands
    # in; whatever keys are compared belong to storages still alive (a layer's, and count_saved holds
    # the layer before's), so no address in a comparison has been reused.
    return t.untyped_storage()._cdata


class _TensorParallel(TorchDispatchMode):
    """Which storages of one layer a Megatron TP group splits, and the bytes it all-reduces: forward
    after each row-parallel product (operator g), backward the gradient of each whole tensor that
    column-parallel products take (operator f: once per tensor, QKV's three products or SwiGLU's two
    sharing it)."""

    _PRODUCTS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}

    def __init__(self, weights: set[int], inputs: set[int]):
        super().__init__()
        self.weights, self.inputs = weights, inputs
        self.split: dict[int, torch.UntypedStorage] = {}
        self.allreduce_bytes = self.allreduce_calls = self.bwd_bytes = 0
        self.copied: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        operands = [t for t in tensors if _key(t) not in self.weights]
        split = any(_key(t) in self.split for t in operands)
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if len(operands) < len(tensors) and func in self._PRODUCTS:
            if split:                                      # row-parallel: all-reduced, whole again
                self._all_reduce(outputs)
            else:                                          # column-parallel: all-reduces backward
                self._copy(operands)
            split = not split
        elif func is aten.embedding.default and any(_key(t) in self.inputs for t in operands):
            self._all_reduce(outputs)                      # vocab-parallel lookup
        if split:
            self.split.update((_key(t), t.untyped_storage()) for t in outputs)
        return out

    def _all_reduce(self, outputs: list[torch.Tensor]) -> None:
        self.allreduce_bytes += sum(t.nbytes for t in outputs)
        self.allreduce_calls += 1

    def _copy(self, operands: list[torch.Tensor]) -> None:
        for t in operands:                             # a model input that needs no gradient sends none
            if t.requires_grad and _key(t) not in self.copied:
                self.copied.add(_key(t))
                self.bwd_bytes += t.nbytes


class _AsOnCuda(TorchFunctionMode):
    """On CPU and meta tensors, the calls whose CUDA kernel saves other tensors run as CUDA's would
    (attention too unless `fused_attention` is False: then it keeps its math path's probabilities)."""

    def __init__(self, fused_attention: bool = True):
        super().__init__()
        self.fused_attention = fused_attention

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensor = next((a for a in args if isinstance(a, torch.Tensor)), None)
        substitute = _SUBSTITUTES.get(func)
        if func is F.scaled_dot_product_attention and not self.fused_attention:
            substitute = None
        if substitute is not None and tensor is not None and tensor.device.type in ("cpu", "meta"):
            out = substitute(*args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)


def _attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
               enable_gqa=False):
    """The fused kernel (CUDA's flash or memory-efficient, CPU's flash), which saves no s x s tensor."""
    if attn_mask is not None or dropout_p or query.dim() != 4 or (key.shape[1] != query.shape[1]
                                                                  and not enable_gqa):
        return None                                        # leave it to torch
    return aten._scaled_dot_product_flash_attention_for_cpu(query, key, value, 0.0, is_causal,
                                                            scale=scale)[0]


def _dropout(input, p=0.5, training=True, inplace=False):
    return torch.native_dropout(input, p, True)[0] if training and p and not inplace else None


def _rms_norm(input, normalized_shape, weight=None, eps=None):
    return _FusedRMSNorm.apply(input, weight, list(normalized_shape), eps)


class _FusedRMSNorm(torch.autograd.Function):
    """RMSNorm saving what CUDA's fused kernel saves (input and 1/rms); its backward recomputes."""

    @staticmethod
    def forward(ctx, x, weight, shape, eps):
        out, rstd = aten._fused_rms_norm(x, shape, weight, eps)
        ctx.save_for_backward(x, rstd, weight)
        ctx.shape, ctx.eps = shape, eps
        return out

    @staticmethod
    def backward(ctx, grad):
        x, _, weight = ctx.saved_tensors
        leaves = [t.detach().requires_grad_(need) if t is not None else None
                  for t, need in zip((x, weight), ctx.needs_input_grad[:2])]
        with torch.enable_grad():
            out = torch.rms_norm(leaves[0], ctx.shape, leaves[1], ctx.eps)
        wanted = [t for t in leaves if t is not None and t.requires_grad]
        grads = iter(torch.autograd.grad(out, wanted, grad))
        return (*(next(grads) if t is not None and t.requires_grad else None for t in leaves), None, None)


_SUBSTITUTES = {F.scaled_dot_product_attention: _attention, F.dropout: _dropout, F.rms_norm: _rms_norm}
