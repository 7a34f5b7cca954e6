"""Llama 3 (Grattafiori et al. 2024, "The Llama 3 Herd of Models", Table 3): a pre-norm decoder with
RMSNorm, rotary position embeddings (no learned positions), grouped-query attention and a SwiGLU MLP.
Shapes and parameter names follow HF's LlamaForCausalLM, so Llama-3-8B counts 8,030,261,248
parameters. As in modelzoo.gpt, blocks and the embedding stay whole in the layer graph, and the head
has its own matrix (Llama-3-8B does not tie it).

The rotary tables are buffers of each block (a stage holds whole blocks), computed once, not per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["llama", "LlamaConfig", "PRESETS"]


@dataclass(frozen=True, kw_only=True)
class LlamaConfig:
    n_layer: int = 32
    d_model: int = 4096
    n_head: int = 32
    n_kv_head: int = 8
    d_ff: int = 14336
    seq_len: int = 8192
    vocab_size: int = 128256
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5

    def __post_init__(self):
        if self.d_model % self.n_head or self.n_head % self.n_kv_head:
            raise ValueError(f"d_model {self.d_model}, n_head {self.n_head}, n_kv_head {self.n_kv_head}: "
                             "d_model must be a multiple of n_head, and n_head of n_kv_head")
        if (self.d_model // self.n_head) % 2:
            raise ValueError(f"head width {self.d_model // self.n_head} must be even for rotary embeddings")


PRESETS = {"llama-3-8b": LlamaConfig()}


class Embeddings(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.tokens = nn.Embedding(c.vocab_size, c.d_model)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tokens(ids)


class Block(nn.Module):
    """RMSNorm, causal grouped-query attention with rotary positions, RMSNorm, SwiGLU MLP; each sublayer
    with a residual connection. No dropout (Llama trains without)."""

    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.n_head, self.n_kv_head, head = c.n_head, c.n_kv_head, c.d_model // c.n_head
        self.norm1 = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.norm2 = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.q = nn.Linear(c.d_model, c.n_head * head, bias=False)
        self.k = nn.Linear(c.d_model, c.n_kv_head * head, bias=False)
        self.v = nn.Linear(c.d_model, c.n_kv_head * head, bias=False)
        self.o = nn.Linear(c.n_head * head, c.d_model, bias=False)
        self.gate = nn.Linear(c.d_model, c.d_ff, bias=False)
        self.up = nn.Linear(c.d_model, c.d_ff, bias=False)
        self.down = nn.Linear(c.d_ff, c.d_model, bias=False)
        cos, sin = _rotary_tables(c.seq_len, head, c.rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.norm1(x)
        q = self.q(h).view(b, t, self.n_head, -1).transpose(1, 2)
        k = self.k(h).view(b, t, self.n_kv_head, -1).transpose(1, 2)
        v = self.v(h).view(b, t, self.n_kv_head, -1).transpose(1, 2)
        cos, sin = self.cos[:t], self.sin[:t]
        att = F.scaled_dot_product_attention(_rotate(q, cos, sin), _rotate(k, cos, sin), v, is_causal=True,
                                             enable_gqa=True)
        x = x + self.o(att.transpose(1, 2).reshape(b, t, d))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def _rotary_tables(seq_len: int, head: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position x frequency, (seq_len, head), halves repeated (Su et al. 2021, as HF)."""
    freq = 1.0 / theta ** (torch.arange(0, head, 2, dtype=torch.float32) / head)
    angle = torch.outer(torch.arange(seq_len, dtype=torch.float32), freq)
    angle = torch.cat((angle, angle), dim=-1)
    return angle.cos(), angle.sin()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class Llama(nn.Module):
    leaf_modules = (Embeddings, Block)

    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.input_shape, self.vocab_size = (c.seq_len,), c.vocab_size
        self.embed = Embeddings(c)
        self.blocks = nn.Sequential(*(Block(c) for _ in range(c.n_layer)))
        self.norm = nn.RMSNorm(c.d_model, eps=c.norm_eps)
        self.head = nn.Linear(c.d_model, c.vocab_size, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(self.embed(ids))))


def llama(preset: str = "llama-3-8b", **overrides) -> Llama:
    """A preset, with any LlamaConfig field overridden (e.g. n_layer=2, seq_len=64 for tests)."""
    base = PRESETS[preset]
    return Llama(LlamaConfig(**{**base.__dict__, **overrides}))
