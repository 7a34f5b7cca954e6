"""Closed forms of transformer layers against the published counts."""

import pytest

from hetsim.transformer import TransformerShape, transformer_costs, transformer_layers

OPT350 = TransformerShape(n_layer=24, hidden=1024, heads=16, seq_len=2048, vocab=50272)


def test_block_parameters_are_12h2_plus_13h():
    h = OPT350.hidden
    assert OPT350.block_params() == 12 * h * h + 13 * h


def test_llama3_8b_has_8_billion_parameters():
    llama = TransformerShape(n_layer=32, hidden=4096, heads=32, kv_heads=8, ffn=14336, gated_mlp=True,
                             seq_len=8192, vocab=128256, learned_positions=False, tail_layers=2)
    params = sum(l.param_bytes for l in transformer_layers(llama, 1)) / 4
    assert params == pytest.approx(8.03e9, rel=0.005)


def test_saved_bytes_reduce_to_korthikanti_at_fp16_with_attention_dropout():
    # The paper: s*b*h*(34 + 5*a*s/h) bytes per block at 16 bit, of which 10*s*b*h kept by every TP rank.
    shape = TransformerShape(n_layer=1, hidden=1024, heads=16, seq_len=2048, vocab=8, attention_dropout=True)
    block = transformer_layers(shape, batch=2)[1]
    s, b, h, a = 2048, 2, 1024, 16
    fp32_elements = s * b * h * 16 + 2 * a * s * s * b        # what is stored at 4 bytes
    masks = s * b * h * 2 + a * s * s * b                      # dropout masks, 1 byte each
    assert block.saved_bytes == 4 * fp32_elements + masks
    # The same formula with 2-byte elements is the paper's.
    assert 2 * fp32_elements + masks == s * b * h * (34 + 5 * a * s / h)
    assert block.saved_replicated_bytes == s * b * h * (4 * 4 + 2)


def test_block_flops_are_24bsh2_plus_4bs2h_forward_and_twice_that_backward():
    s, b, h = 2048, 1, 1024
    cost = transformer_costs(OPT350, b)[1]
    assert cost.flops_fwd == pytest.approx(24 * b * s * h * h + 4 * b * s * s * h, rel=1e-3)
    assert cost.flops_bwd == 2 * cost.flops_fwd


def test_saved_bytes_scale_with_the_batch():
    one, four = transformer_layers(OPT350, 1), transformer_layers(OPT350, 4)
    assert all(4 * x.saved_bytes == y.saved_bytes for x, y in zip(one, four))
