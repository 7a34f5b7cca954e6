"""How attention's work is counted: as one fused kernel, or as the operations it decomposes into.

    with counted_attention("fused"):
        ...   # F.scaled_dot_product_attention on meta tensors is counted as a fused kernel

On the meta device, where modelzoo counts, F.scaled_dot_product_attention runs its math path: two
batched products, a mask and a softmax, the s x s scores and probabilities going through memory.
That is attention without a fused kernel ("materialized"): Megatron-LM's default core attention, and
how the shipped kernel-class factors were fitted to Sailor's runs (whose block times fit fused
counting as well once refitted: experiments/profiles/sailor_layers_fused.md). On a GPU, PyTorch runs the
same call as one flash or memory-efficient kernel that keeps the s x s tiles on chip ("fused"), as
modelzoo's transformers run under the executor on CUDA. Counted fused, the call is
aten._scaled_dot_product_efficient_attention: FLOPs as torch.utils.flop_counter counts that kernel
(its backward recomputes the scores), bytes Q, K, V, the output and a logsumexp. Grouped-query
attention is counted with K and V expanded to every head first (the expansion's copy and its
gradient's sum count as elementwise work), which a kernel reading shared heads in place would not do:
at Llama-3-8B's 4 query heads per K/V head that is under 2 % of a block's bytes.
A call the kernel cannot take (not 4-D, or unequal heads without enable_gqa) is counted materialized,
with a warning.
"""

from __future__ import annotations

import warnings
from contextlib import contextmanager
from typing import Iterator

import torch
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["ATTENTION", "counted_attention", "check_attention"]

ATTENTION = ("fused", "materialized")


def check_attention(attention: str) -> None:
    if attention not in ATTENTION:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION)}, got {attention!r}")


@contextmanager
def counted_attention(attention: str) -> Iterator[None]:
    """Count F.scaled_dot_product_attention as `attention` says (see the module docstring)."""
    check_attention(attention)
    if attention == "materialized":
        yield
        return
    with _Fused():
        yield


class _Fused(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            out = _fused(*args, **kwargs)
            if out is not None:
                return out
        return func(*args, **kwargs)


def _fused(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if query.device.type != "meta":
        return None               # real tensors: torch picks its own kernel (the counted one has no CPU code)
    if query.dim() != 4 or (key.shape[1] != query.shape[1] and not enable_gqa):
        warnings.warn(f"attention of shape {tuple(query.shape)} is counted materialized: the fused kernel "
                      "takes 4-D (batch, heads, sequence, width) inputs with equal heads or enable_gqa")
        return None
    if key.shape[1] != query.shape[1]:
        groups = query.shape[1] // key.shape[1]
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, attn_mask, needs_grad, dropout_p, is_causal, scale=scale)[0]
