"""What each model trains on: the shapes of its inputs and labels, and its loss, in one place, so the
executor, its calibrations (executor.calibrate, executor.colocation) and the profiler agree.

- "classify" (image classifiers, the MLP): float inputs of the model's input shape, one class label per
  sample, cross-entropy over the classes (the width of the model's output).
- "next_token" (decoder language models): token ids in [0, vocab) of shape (batch, seq_len); the labels
  are the same token stream one position on (position t is labelled with token t + 1), and the loss
  is the cross-entropy over the vocabulary at every position, averaged (GPT-2's language-modelling
  objective, Radford et al. 2019, section 2). A model is a decoder LM when it says `vocab_size`: the
  attribute by which modelzoo.build already feeds it token ids, so a new decoder needs nothing here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

__all__ = ["CLASSIFY", "NEXT_TOKEN", "Task", "task_of", "loss", "shifted"]

CLASSIFY, NEXT_TOKEN = "classify", "next_token"


@dataclass(frozen=True, kw_only=True)
class Task:
    kind: str                          # CLASSIFY or NEXT_TOKEN
    input_shape: tuple[int, ...]       # per sample: features or (channels, height, width); (seq_len,)
    n_classes: int                     # classes, or the vocabulary size

    def __post_init__(self):
        if self.kind not in (CLASSIFY, NEXT_TOKEN):
            raise ValueError(f"task: unknown kind {self.kind!r}; expected {CLASSIFY} or {NEXT_TOKEN}")
        if self.n_classes < 1:
            raise ValueError(f"task: n_classes must be >= 1, got {self.n_classes}")
        if self.kind == NEXT_TOKEN and len(self.input_shape) != 1:
            raise ValueError(f"task: a language model's input is (seq_len,) per sample, got {self.input_shape}")

    @property
    def tokens_per_sample(self) -> int | None:
        """Positions a language model predicts per sample (what tokens/s counts); None for a classifier."""
        return self.input_shape[0] if self.kind == NEXT_TOKEN else None

    def random_batch(self, batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Random (inputs, labels) of a minibatch, for throughput runs and calibrations (their values
        change no cost). A language model's labels are still its inputs shifted by one."""
        if self.kind == NEXT_TOKEN:
            return shifted(torch.randint(self.n_classes, (batch, self.input_shape[0] + 1), generator=generator))
        return (torch.randn((batch, *self.input_shape), generator=generator),
                torch.randint(self.n_classes, (batch,), generator=generator))


def shifted(stream: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A token stream (batch, seq_len + 1) as next-token (inputs, labels): the label of position t is token t + 1."""
    return stream[:, :-1], stream[:, 1:]


def task_of(model: nn.Module, example: torch.Tensor) -> Task:
    """The task of `model` fed batches like `example` (modelzoo.build's). A classifier's class count is
    the width of its output for one sample, run in eval mode (no batch-norm statistics change)."""
    shape = tuple(example.shape[1:])
    vocab = getattr(model, "vocab_size", None)
    if vocab is not None:
        return Task(kind=NEXT_TOKEN, input_shape=shape, n_classes=int(vocab))
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(example[:1])
    finally:
        model.train(training)
    return Task(kind=CLASSIFY, input_shape=shape, n_classes=int(out.shape[-1]))


def loss(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of class scores (batch, classes) against labels (batch,), or of per-position scores
    (batch, seq_len, vocab) against labels (batch, seq_len): the mean over every sample or position."""
    return F.cross_entropy(scores.reshape(-1, scores.shape[-1]), labels.reshape(-1))
