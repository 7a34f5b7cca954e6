"""A GPT-2-style decoder (Radford et al. 2019): token + position embeddings, pre-norm transformer
blocks, final norm and a language-model head. Blocks and the embeddings stay whole in the layer
graph (`leaf_modules`), so a pipeline stage holds whole blocks.

The head is not tied to the token embedding (GPT-2 ties them): tied weights cannot live in two
pipeline stages, so the head has its own vocab x width matrix (+38.6 M parameters at GPT-2 small).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["gpt", "GPTConfig", "PRESETS"]


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    n_layer: int = 12
    d_model: int = 768
    n_head: int = 12
    seq_len: int = 1024
    vocab_size: int = 50257

    def __post_init__(self):
        if self.d_model % self.n_head:
            raise ValueError(f"d_model {self.d_model} is not a multiple of n_head {self.n_head}")


PRESETS = {
    "gpt2-small": GPTConfig(n_layer=12, d_model=768, n_head=12),
    "gpt2-medium": GPTConfig(n_layer=24, d_model=1024, n_head=16),
    # The two GPT models Sailor (SOSP'25) trains with Megatron-DeepSpeed, as its configs give them.
    # OPT-350M in Megatron's GPT shape: HF's OPT-350M (Zhang et al. 2022) also projects its 512-wide
    # embeddings in and out of the 1024-wide blocks and is post-norm; Sailor's config models neither.
    "opt-350m": GPTConfig(n_layer=24, d_model=1024, n_head=16, seq_len=2048, vocab_size=50272),
    # GPT-Neo 2.7B in GPT-3 2.7B's shape (Brown et al. 2020, Table 2.1: 32 heads of 80); HF's GPT-Neo
    # has 20 heads of 128, no Q/K/V biases (32 x 3 x 2560 fewer parameters) and local attention in
    # every other layer.
    "gpt-neo-2.7b": GPTConfig(n_layer=32, d_model=2560, n_head=32, seq_len=2048),
}


class Embeddings(nn.Module):
    def __init__(self, c: GPTConfig):
        super().__init__()
        self.tokens = nn.Embedding(c.vocab_size, c.d_model)
        self.positions = nn.Embedding(c.seq_len, c.d_model)
        self.dropout = nn.Dropout(0.1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.shape[1], device=ids.device)
        return self.dropout(self.tokens(ids) + self.positions(pos))


class Block(nn.Module):
    """Pre-norm causal self-attention and a 4x-wide GELU MLP, each with a residual connection."""

    def __init__(self, c: GPTConfig):
        super().__init__()
        self.n_head = c.n_head
        self.ln1, self.ln2 = nn.LayerNorm(c.d_model), nn.LayerNorm(c.d_model)
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model)
        self.proj = nn.Linear(c.d_model, c.d_model)
        self.mlp = nn.Sequential(nn.Linear(c.d_model, 4 * c.d_model), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * c.d_model, c.d_model))
        self.dropout = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.n_head, d // self.n_head).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.dropout(self.proj(att.transpose(1, 2).reshape(b, t, d)))
        return x + self.dropout(self.mlp(self.ln2(x)))


class GPT(nn.Module):
    leaf_modules = (Embeddings, Block)

    def __init__(self, c: GPTConfig):
        super().__init__()
        self.input_shape, self.vocab_size = (c.seq_len,), c.vocab_size
        self.embed = Embeddings(c)
        self.blocks = nn.Sequential(*(Block(c) for _ in range(c.n_layer)))
        self.ln_f = nn.LayerNorm(c.d_model)
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.ln_f(self.blocks(self.embed(ids))))


def gpt(preset: str = "gpt2-small", **overrides) -> GPT:
    """A preset, with any GPTConfig field overridden (e.g. n_layer=2, seq_len=64 for tests)."""
    base = PRESETS[preset]
    return GPT(GPTConfig(**{**base.__dict__, **overrides}))
