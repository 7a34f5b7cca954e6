"""Attention counted fused (one kernel, no s x s tensor in memory) or materialized (the math path)."""

import pytest

from modelzoo.counting import count_model
from modelzoo.kernel_classes import split_by_kernel_class

SHAPE = {"n_layer": 1, "seq_len": 1024}


def _block(model, attention, batch=2, **shape):
    counted = count_model(model, batch=batch, attention=attention, **shape)
    return {p.kind: p for p in split_by_kernel_class(model, batch, counted, attention=attention, **shape)[1].parts}


def test_fused_attention_does_the_same_forward_products_without_the_score_matrix_in_memory():
    fused, materialized = _block("gpt2-small", "fused", **SHAPE), _block("gpt2-small", "materialized", **SHAPE)
    b, s, d, heads = 2, 1024, 768, 12
    assert fused["attention"].flops_fwd == materialized["attention"].flops_fwd == 2 * 2 * b * s**2 * d
    assert fused["gemm"] == materialized["gemm"]
    # Materialized attention writes and reads b h s^2 scores at least once (FP32, 4 bytes each).
    scores = b * heads * s**2 * 4
    assert materialized["attention"].bytes_fwd > scores > fused["attention"].bytes_fwd
    # Fused: Q, K, V in, output and a logsumexp out; nothing of size s^2.
    assert fused["attention"].bytes_fwd < 5 * b * s * d * 4
    assert fused["elementwise"].bytes_fwd < materialized["elementwise"].bytes_fwd - scores


def test_fused_grouped_query_attention_is_counted_with_its_shared_key_value_heads():
    llama = {"n_layer": 1, "seq_len": 512, "d_model": 256, "n_head": 8, "n_kv_head": 2, "vocab_size": 128}
    fused = _block("llama-3-8b", "fused", batch=1, **llama)
    materialized = _block("llama-3-8b", "materialized", batch=1, **llama)
    assert fused["attention"].flops_fwd == materialized["attention"].flops_fwd > 0
    # Counted as the kernel (Q, K, V, output, logsumexp), not the scores: 8 heads x 512^2 x 4 bytes.
    assert fused["attention"].bytes_fwd < 8 * 512**2 * 4 < materialized["attention"].bytes_fwd


def test_attention_on_real_tensors_is_left_to_torch():
    import torch
    from torch.nn import functional as F

    from modelzoo.attention import counted_attention
    q = torch.randn(1, 2, 8, 4)
    with counted_attention("fused"):
        out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert torch.allclose(out, F.scaled_dot_product_attention(q, q, q, is_causal=True))


def test_an_unknown_attention_is_refused():
    with pytest.raises(ValueError, match="attention must be one of fused, materialized"):
        count_model("gpt2-small", batch=1, attention="flash", **SHAPE)
    with pytest.raises(ValueError, match="attention must be one of"):
        split_by_kernel_class("gpt2-small", 1, [], attention="flash")
