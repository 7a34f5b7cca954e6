"""Closed forms of a decoder-only transformer's layers, as Megatron-LM splits them: parameters, FLOPs,
what autograd saves for backward and what tensor parallelism all-reduces. No torch: the importer of
other teams' measurements and derived-only predictions use these where no zoo model is counted.

Layer order (as Megatron and Sailor number them): 0 the embedding, 1..n_layer the blocks, then the
final norm and the language-model head. Saved bytes follow Korthikanti et al. 2022 ("Reducing
Activation Recomputation in Large Transformer Models", section 4.1), per block and minibatch of b
sequences of s tokens, width h, a heads, e bytes per element (4 at FP32):

    kept whole by every TP member:  s·b·h·(4e + 2)       norm inputs, block inputs, 2 dropout masks
    split 1/t over a TP group:      s·b·h·e·(q + 1 + m) + a·s²·b·(e + d·(e + 1))

with q = 1 + 2·kv/a the Q, K, V widths (kv key/value heads: grouped-query attention), 1 the output
projection's input, m = 2·ffn/h the MLP's two saved activations (3·ffn/h when gated, SwiGLU), and d = 1
when attention dropout is on (its mask and output are saved beside the softmax probabilities). At
FP16 with ffn = 4h, kv = a and d = 1 this is the paper's s·b·h·(34 + 5·a·s/h).

Tensor-parallel all-reduces (Megatron's operators: g all-reduces forward after a row-parallel product or
the vocabulary-parallel lookup, f all-reduces backward the gradient of a column-parallel product's
input), of s·b·h·e bytes each: the embedding one forward, none backward; a block two each way; the
head none forward but its loss's three per-token values, one backward.
"""

from __future__ import annotations

import math

from dataclasses import dataclass

from hetsim.derive import LayerCost
from hetsim.profile import LayerProfile

__all__ = ["TransformerShape", "transformer_layers", "transformer_costs"]


@dataclass(frozen=True, kw_only=True)
class TransformerShape:
    n_layer: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    ffn: int = 0                        # 0: 4 x hidden
    kv_heads: int = 0                   # 0: heads (no grouped-query attention)
    gated_mlp: bool = False             # SwiGLU (Llama): three hidden x ffn matrices
    learned_positions: bool = True      # GPT-2/OPT; Llama uses rotary embeddings
    attention_dropout: bool = False     # OPT and Llama train with attention dropout 0
    tail_layers: int = 1                # layers after the blocks: final norm and head (1 or 2)

    @property
    def ffn_width(self) -> int:
        return self.ffn or 4 * self.hidden

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def tp_divisor(self) -> int:
        """What a tensor-parallel degree must divide: Megatron splits whole heads, query and key/value."""
        return math.gcd(self.heads, self.kv)

    @property
    def n_layers(self) -> int:
        return 1 + self.n_layer + self.tail_layers

    def block_params(self) -> int:
        h, f = self.hidden, self.ffn_width
        kv_width = h * self.kv // self.heads
        attention = h * (h + 2 * kv_width) + (h + 2 * kv_width) + h * h + h
        mlp = (3 * h * f) if self.gated_mlp else (2 * h * f + f + h)
        return attention + mlp + 4 * h

    def embedding_params(self) -> int:
        return self.vocab * self.hidden + (self.seq_len * self.hidden if self.learned_positions else 0)


def transformer_layers(shape: TransformerShape, batch: int) -> list[LayerProfile]:
    """Every layer with parameter, output, saved and TP all-reduce bytes at FP32; no times."""
    s, b, h, e = shape.seq_len, batch, shape.hidden, 4
    sbh = s * b * h
    q = 1 + 2 * shape.kv / shape.heads
    m = (3 if shape.gated_mlp else 2) * shape.ffn_width / h
    d = 1 if shape.attention_dropout else 0
    replicated = sbh * (4 * e + 2)
    split = sbh * e * (q + 1 + m) + shape.heads * s * s * b * (e + d * (e + 1))
    # The embedding keeps its dropout mask and the token ids (int64); a block its two 1-byte dropout
    # masks (the mask attention dropout keeps is split with the heads, and counted with the rest).
    layers = [LayerProfile(name="embedding", kind="Embeddings", param_bytes=4 * shape.embedding_params(),
                           output_bytes=sbh * e, fwd_s={}, bwd_s={}, saved_bytes=sbh + 8 * s * b,
                           saved_replicated_bytes=sbh + 8 * s * b, saved_nonfloat_bytes=sbh + 8 * s * b,
                           tp_allreduce_bytes=sbh * e, tp_allreduce_calls=1, tp_allreduce_bwd_bytes=0)]
    layers += [LayerProfile(name=f"block{i}", kind="Block", param_bytes=4 * shape.block_params(),
                            output_bytes=sbh * e, fwd_s={}, bwd_s={}, saved_bytes=int(replicated + split),
                            saved_replicated_bytes=int(replicated), saved_nonfloat_bytes=2 * sbh,
                            tp_allreduce_bytes=2 * sbh * e, tp_allreduce_calls=2)
               for i in range(shape.n_layer)]
    # The head keeps the final norm's input and output (the product's input) and two tensors as large
    # as the logits: the logits themselves, which a pipeline engine holds as the last stage's output
    # until its backward (DeepSpeed's pipe buffers), and the loss's exponentials of them. Under TP
    # its loss is vocabulary-parallel: three all-reduces of one FP32 per token forward (the row
    # maxima, the target logits, the exponential sums); backward, one of its input's gradient.
    logits = s * b * shape.vocab * e
    loss_ar = dict(tp_allreduce_bytes=3 * s * b * 4, tp_allreduce_calls=3, tp_allreduce_bwd_bytes=sbh * e,
                   tp_allreduce_bwd_calls=1)
    tail = [LayerProfile(name="head", kind="Head", param_bytes=4 * (shape.vocab * h + 2 * h),
                         output_bytes=logits, fwd_s={}, bwd_s={}, saved_bytes=2 * sbh * e + 2 * logits,
                         saved_replicated_bytes=2 * sbh * e, **loss_ar)]
    if shape.tail_layers == 2:
        tail.insert(0, LayerProfile(name="final_norm", kind="Norm", param_bytes=4 * 2 * h,
                                    output_bytes=sbh * e, fwd_s={}, bwd_s={}, saved_bytes=sbh * e,
                                    saved_replicated_bytes=sbh * e))
        tail[1] = LayerProfile(name="head", kind="Head", param_bytes=4 * shape.vocab * h, output_bytes=logits,
                               fwd_s={}, bwd_s={}, saved_bytes=sbh * e + 2 * logits,
                               saved_replicated_bytes=sbh * e, **loss_ar)
    return layers + tail


def transformer_costs(shape: TransformerShape, batch: int) -> list[LayerCost]:
    """FLOPs (multiply-add = 2) and bytes moved per layer and pass, for the roofline of hetsim.derive:
    a pass reads its weights and writes then reads back what it saves; backward does twice the work."""
    s, b, h = shape.seq_len, batch, shape.hidden
    tokens = s * b
    out = []
    for layer in transformer_layers(shape, batch):
        if layer.kind == "Block":
            flops = 2 * tokens * (shape.block_params() - 4 * h) + 4 * b * s * s * h
        elif layer.kind == "Head":
            flops = 2 * tokens * h * shape.vocab
        else:
            flops = 0.0
        traffic = layer.param_bytes + 2 * (layer.saved_bytes or 0) + layer.output_bytes
        out.append(LayerCost(kind=layer.kind, flops_fwd=float(flops), flops_bwd=2.0 * flops,
                             bytes_fwd=float(traffic), bytes_bwd=2.0 * traffic))
    return out
