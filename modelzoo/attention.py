"""How attention's work is counted: as one fused kernel, or as the operations it decomposes into.

    with counted_attention("fused"):
        ...   # F.scaled_dot_product_attention on meta/CPU tensors is counted as a fused kernel

On the meta device, where modelzoo counts, F.scaled_dot_product_attention runs its math path: two
batched products, a mask and a softmax, the s x s scores and probabilities going through memory.
That is attention without a fused kernel ("materialized"): Megatron-LM's default core attention, the
runs Sailor measured and the shipped kernel-class factors were fitted to. On a GPU, PyTorch runs the
same call as one flash or memory-efficient kernel that keeps the s x s tiles on chip ("fused"), as
modelzoo's transformers run under the executor on CUDA. Counted fused, the call is
aten._scaled_dot_product_efficient_attention: FLOPs as torch.utils.flop_counter counts that kernel
(its backward recomputes the scores), bytes Q, K, V, the output and a logsumexp.
"""

from __future__ import annotations

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
    if query.device.type not in ("meta", "cpu") or query.dim() != 4:
        return None                                        # leave it to torch
    if key.shape[1] != query.shape[1]:
        if not enable_gqa:
            return None
        groups = query.shape[1] // key.shape[1]            # grouped-query attention: K, V heads shared
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        query, key, value, attn_mask, needs_grad, dropout_p, is_causal, scale=scale)[0]
