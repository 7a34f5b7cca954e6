"""Tensor parallelism of modelzoo's GPT as Megatron-LM splits a transformer (Shoeybi et al. 2019, §3).

Member k of a group of t holds, of each block:
- the fused QKV product column-parallel by *heads*: heads [k nh/t, (k+1) nh/t) of each of Q, K and V
  (a plain row split of the fused 3d x d weight would give member 0 all of Q and half of K), so it
  runs attention on its own heads;
- the attention output projection row-parallel (its 1/t of the input features), then an all-reduce;
- the MLP's first product column-parallel (1/t of the hidden units), its second row-parallel, then an
  all-reduce.
An all-reduce after a row-parallel product is Megatron's operator g (all-reduce forward, identity
backward); before each column-parallel product stands operator f (identity forward, all-reduce of the
gradient backward), so every member's gradient of a replicated tensor is the whole one.

The token embedding and the LM head are split by vocabulary (§3, "input embedding"): a member looks up
only the ids in its range and the lookups are all-reduced; the head gives each member the logits of
its vocabulary range and the loss is the vocabulary-parallel cross-entropy, so no member ever holds a
whole row of logits (each member's head rows are padded to a multiple of 8, see VocabParallelHead).
Replicated (every member computes them on equal tensors): the layer norms, the position embedding,
the row-parallel products' biases (added once, after the all-reduce) and dropout, whose masks are
equal because every member starts from one seed and draws the same shapes in the same order
(Megatron's RNG tracker does this for the regions outside the split).

Why not torch.distributed.tensor.parallel: ColwiseParallel/RowwiseParallel do run on gloo (torch 2.13:
an MLP's forward, input and weight gradients equal the unsplit module's), but they make parameters
DTensors, and the executor's StageModel keeps each weight as a plain tensor that it stashes, flattens
into one vector for BSP's all-reduce and checkpoints; and they split the fused QKV weight by rows.

    comm = TPComm(rank=k, size=t, group=process_group)
    split_stage(graph, lo, hi, comm)       # layers [lo, hi) of a LayerGraph become member k's share
    loss_fn = stage_loss(graph, hi)        # the vocabulary-parallel loss when the stage ends with the head
"""

from __future__ import annotations

import time
from typing import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import skip_init

from modelzoo.gpt import Block as GPTBlock
from modelzoo.gpt import Embeddings as GPTEmbeddings
from modelzoo.graph import LayerGraph
from modelzoo.tasks import loss as task_loss

__all__ = ["TPComm", "TPBlock", "VocabParallelEmbedding", "VocabParallelHead", "split_stage",
           "unsplittable", "stage_loss", "copy_to_group", "reduce_from_group"]


class TPComm:
    """One member's view of its tensor-parallel group: its index, the group's size, the process group
    (None: no communication, to time one member's work alone) and where a tensor must be for the
    group to move it. Records the (start, end) perf_counter of every all-reduce in `spans`."""

    def __init__(self, rank: int, size: int, group=None, wire: torch.device | str = "cpu"):
        if not 0 <= rank < size:
            raise ValueError(f"tensor-parallel rank {rank} outside a group of {size}")
        self.rank, self.size, self.group, self.wire = rank, size, group, torch.device(wire)
        self.spans: list[tuple[float, float]] = []

    def all_reduce(self, t: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        """A new tensor: `t` reduced over the group (a copy of `t` without a group)."""
        t0 = time.perf_counter()
        buf = torch.empty(t.shape, dtype=t.dtype, device=self.wire).copy_(t)
        if self.group is not None:
            dist.all_reduce(buf, op=op, group=self.group)
        out = buf if buf.device == t.device else buf.to(t.device)
        self.spans.append((t0, time.perf_counter()))
        return out

    def drain(self) -> list[tuple[float, float]]:
        spans, self.spans = self.spans, []
        return spans

    def share(self, n: int) -> tuple[int, int]:
        """This member's range [a, b) of n things split as evenly as they go."""
        return n * self.rank // self.size, n * (self.rank + 1) // self.size


class _CopyToGroup(torch.autograd.Function):
    """Megatron's f: identity forward; the gradient all-reduced backward."""

    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return ctx.comm.all_reduce(grad), None


class _ReduceFromGroup(torch.autograd.Function):
    """Megatron's g: all-reduce forward; identity backward."""

    @staticmethod
    def forward(ctx, x, comm):
        return comm.all_reduce(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def copy_to_group(x: torch.Tensor, comm: TPComm) -> torch.Tensor:
    return _CopyToGroup.apply(x, comm)


def reduce_from_group(x: torch.Tensor, comm: TPComm) -> torch.Tensor:
    return _ReduceFromGroup.apply(x, comm)


def _linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Linear:
    """A Linear holding copies of `weight` and `bias`. Built without an initialisation, which would
    draw from the random stream the members' dropout masks must share with an unsplit run."""
    layer = skip_init(nn.Linear, weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias is not None:
            layer.bias.copy_(bias)
    return layer


class TPBlock(nn.Module):
    """Member comm.rank's share of a modelzoo.gpt Block (see the module docstring); same input and output."""

    def __init__(self, block: GPTBlock, comm: TPComm):
        super().__init__()
        d, nh = block.qkv.in_features, block.n_head
        self.comm, self.n_head, self.head_dim = comm, nh // comm.size, d // nh
        self.ln1, self.ln2, self.dropout = block.ln1, block.ln2, block.dropout
        h0, h1 = comm.share(nh)
        w = block.qkv.weight.detach().view(3, nh, self.head_dim, d)[:, h0:h1].reshape(-1, d)
        b = block.qkv.bias.detach().view(3, nh, self.head_dim)[:, h0:h1].reshape(-1)
        self.qkv = _linear(w, b)
        c0, c1 = h0 * self.head_dim, h1 * self.head_dim
        self.proj = _linear(block.proj.weight.detach()[:, c0:c1], None)
        self.proj_bias = nn.Parameter(block.proj.bias.detach().clone())
        fc1, self.act, fc2 = block.mlp
        m0, m1 = comm.share(fc1.out_features)
        self.fc1 = _linear(fc1.weight.detach()[m0:m1], fc1.bias.detach()[m0:m1])
        self.fc2 = _linear(fc2.weight.detach()[:, m0:m1], None)
        self.fc2_bias = nn.Parameter(fc2.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = copy_to_group(self.ln1(x), self.comm)
        q, k, v = self.qkv(h).view(b, t, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = reduce_from_group(self.proj(att.transpose(1, 2).reshape(b, t, -1)), self.comm) + self.proj_bias
        x = x + self.dropout(y)
        h = copy_to_group(self.ln2(x), self.comm)
        y = reduce_from_group(self.fc2(self.act(self.fc1(h))), self.comm) + self.fc2_bias
        return x + self.dropout(y)


class VocabParallelEmbedding(nn.Module):
    """Member comm.rank's rows of a modelzoo.gpt Embeddings token table; the position table is replicated."""

    def __init__(self, embed: GPTEmbeddings, comm: TPComm):
        super().__init__()
        self.comm = comm
        self.lo, self.hi = comm.share(embed.tokens.num_embeddings)
        self.tokens = nn.Embedding.from_pretrained(embed.tokens.weight.detach()[self.lo:self.hi].clone(),
                                                   freeze=False)
        self.positions, self.dropout = embed.positions, embed.dropout

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        outside = (ids < self.lo) | (ids >= self.hi)
        found = self.tokens(torch.where(outside, 0, ids - self.lo)).masked_fill(outside.unsqueeze(-1), 0.0)
        pos = torch.arange(ids.shape[1], device=ids.device)
        return self.dropout(reduce_from_group(found, self.comm) + self.positions(pos))


class VocabParallelHead(nn.Module):
    """Member comm.rank's rows of the last Linear (the LM head, or a classifier): the scores of its
    class range; `loss` is the cross-entropy over every member's classes.

    The rows are padded with zeros to a multiple of PAD_ROWS, whose scores are cut off (their weights'
    gradients are zero, so they stay zero), as Megatron-LM pads the vocabulary: GPT-2's 50257 split in
    two gives one member 25129 rows, and its products took 10% longer than 25128 or 25136 rows (one
    thread on this host's CPU), which the other member would wait for at every all-reduce."""

    PAD_ROWS = 8

    def __init__(self, head: nn.Linear, comm: TPComm):
        super().__init__()
        self.comm = comm
        self.lo, self.hi = comm.share(head.out_features)
        n = self.hi - self.lo
        rows = -(-n // self.PAD_ROWS) * self.PAD_ROWS
        w = head.weight.detach().new_zeros(rows, head.in_features)
        w[:n] = head.weight.detach()[self.lo:self.hi]
        b = None
        if head.bias is not None:
            b = head.bias.detach().new_zeros(rows)
            b[:n] = head.bias.detach()[self.lo:self.hi]
        self.linear = _linear(w, b)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(copy_to_group(x, self.comm))[..., :self.hi - self.lo]

    def loss(self, scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return _VocabParallelCrossEntropy.apply(scores, labels, self.lo, self.comm)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of scores split by class over the group (Megatron-LM's vocab-parallel
    cross-entropy): all-reduces of the row maxima, then of each row's exponential sum and target
    score, one message for both; the gradient is softmax - one-hot on each member's own classes."""

    @staticmethod
    def forward(ctx, scores, labels, lo: int, comm: TPComm):
        shape = scores.shape
        scores, labels = scores.reshape(-1, shape[-1]), labels.reshape(-1)
        top = comm.all_reduce(scores.max(dim=1).values, dist.ReduceOp.MAX)
        shifted = scores - top.unsqueeze(1)
        inside = (labels >= lo) & (labels < lo + shape[-1])
        index = torch.where(inside, labels - lo, 0)
        target = shifted.gather(1, index.unsqueeze(1)).squeeze(1).masked_fill(~inside, 0.0)
        exp = shifted.exp_()
        sums = comm.all_reduce(torch.stack((exp.sum(dim=1), target)))
        softmax = exp.div_(sums[0].unsqueeze(1))
        ctx.save_for_backward(softmax, index, inside)
        ctx.shape = shape
        return (sums[0].log() - sums[1]).mean()

    @staticmethod
    def backward(ctx, grad):
        softmax, index, inside = ctx.saved_tensors
        grad_scores = softmax               # runs once (no retain_graph): the saved softmax becomes it
        rows = torch.arange(index.numel(), device=index.device)
        grad_scores[rows, index] -= inside.to(grad_scores.dtype)
        grad_scores.mul_(grad / index.numel())
        return grad_scores.view(ctx.shape), None, None, None


def unsplittable(graph: LayerGraph, lo: int, hi: int, size: int) -> str | None:
    """Why layers [lo, hi) cannot be split over `size` members, or None when they can."""
    for i in range(lo, hi):
        layer = graph.layers[i]
        if isinstance(layer, GPTBlock):
            d, nh, hidden = layer.qkv.in_features, layer.n_head, layer.mlp[0].out_features
            if nh % size or hidden % size:
                return (f"layer {i} ({graph.names[i]}): {nh} heads and {hidden} MLP units must both be "
                        f"multiples of the tensor-parallel degree {size}")
        elif isinstance(layer, GPTEmbeddings):
            if layer.tokens.num_embeddings < size:
                return f"layer {i} ({graph.names[i]}): a vocabulary of {layer.tokens.num_embeddings} over {size} members"
        elif i == len(graph) - 1 and isinstance(layer, nn.Linear):
            if layer.out_features < size:
                return f"layer {i} ({graph.names[i]}): {layer.out_features} classes over {size} members"
        elif any(True for _ in layer.parameters()) and not isinstance(layer, nn.LayerNorm):
            return (f"layer {i} ({graph.names[i]}, {graph.kinds[i]}) has weights tensor parallelism does not "
                    "split (it splits modelzoo.gpt's Embeddings and Block and the last Linear)")
    return None


def split_stage(graph: LayerGraph, lo: int, hi: int, comm: TPComm) -> None:
    """Replace layers [lo, hi) of `graph` with member comm.rank's share (check `unsplittable` first);
    layer norms and layers without weights stay as they are (replicated)."""
    reason = unsplittable(graph, lo, hi, comm.size)
    if reason:
        raise ValueError(f"tensor parallelism: {reason}")
    for i in range(lo, hi):
        layer = graph.layers[i]
        if isinstance(layer, GPTBlock):
            graph.layers[i] = TPBlock(layer, comm)
        elif isinstance(layer, GPTEmbeddings):
            graph.layers[i] = VocabParallelEmbedding(layer, comm)
        elif i == len(graph) - 1 and isinstance(layer, nn.Linear):
            graph.layers[i] = VocabParallelHead(layer, comm)


def stage_loss(graph: LayerGraph, hi: int) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The loss a stage ending at `hi` computes: vocabulary-parallel after a split head, else the task's."""
    last = graph.layers[hi - 1]
    return last.loss if hi == len(graph) and isinstance(last, VocabParallelHead) else task_loss
