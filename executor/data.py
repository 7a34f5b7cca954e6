"""Training data made by code, so nothing is downloaded and every rank can regenerate any minibatch.

The model's task (modelzoo.tasks) fixes the shapes and the loss; the mode fixes the values:
"teacher": a seeded task a small model can learn. Classifiers: inputs x ~ N(0, 1) and labels
    argmax(x[:, :k] @ T) for a fixed random teacher matrix T over the first k input features.
    Language models: token streams in which every token is followed by its fixed random successor
    (a seeded permutation of the vocabulary), from a random first token: a bigram table to learn.
"random": random inputs and labels of the same shapes, for pure throughput runs (a language model's
    labels are still its inputs shifted by one).
Minibatch `mb` of virtual worker `vw` depends only on (seed, vw, mb): the first stage makes the
inputs and the last stage the labels independently, so labels never travel through the pipeline.
"""

from __future__ import annotations

import math

import torch

from modelzoo.tasks import NEXT_TOKEN, Task, shifted

__all__ = ["DATA_MODES", "SyntheticData"]

DATA_MODES = ("teacher", "random")
_TEACHER_FEATURES = 256


class SyntheticData:
    def __init__(self, *, task: Task, mode: str, seed: int, batch: int):
        if mode not in DATA_MODES:
            raise ValueError(f"data: unknown mode {mode!r}; choose one of {', '.join(DATA_MODES)}")
        self.task, self.mode, self.seed, self.batch = task, mode, seed, batch
        g = torch.Generator().manual_seed(seed)
        if task.kind == NEXT_TOKEN:
            self._successor = torch.randperm(task.n_classes, generator=g)
        else:
            self._k = min(math.prod(task.input_shape), _TEACHER_FEATURES)
            self._teacher = torch.randn(self._k, task.n_classes, generator=g)

    def _generator(self, vw: int, mb: int, part: int) -> torch.Generator:
        # Folded into torch's seed range, so any seed the options take works (smaller ones are unchanged).
        return torch.Generator().manual_seed((((self.seed * 1_000_003 + vw) * 1_000_003 + mb) * 4 + part) % 2**63)

    def inputs(self, vw: int, mb: int) -> torch.Tensor:
        if self.task.kind == NEXT_TOKEN:
            return shifted(self._stream(vw, mb))[0]
        return torch.randn((self.batch, *self.task.input_shape), generator=self._generator(vw, mb, 0))

    def labels(self, vw: int, mb: int) -> torch.Tensor:
        if self.task.kind == NEXT_TOKEN:
            return shifted(self._stream(vw, mb))[1]
        if self.mode == "random":
            return torch.randint(self.task.n_classes, (self.batch,), generator=self._generator(vw, mb, 1))
        x = self.inputs(vw, mb).flatten(1)[:, :self._k]
        return (x @ self._teacher).argmax(dim=1)

    def _stream(self, vw: int, mb: int) -> torch.Tensor:
        """The minibatch's token stream, (batch, seq_len + 1): inputs and labels are its two shifts."""
        vocab, length = self.task.n_classes, self.task.input_shape[0] + 1
        g = self._generator(vw, mb, 0)
        if self.mode == "random":
            return torch.randint(vocab, (self.batch, length), generator=g)
        stream = torch.empty((self.batch, length), dtype=torch.long)
        stream[:, 0] = torch.randint(vocab, (self.batch,), generator=g)
        for t in range(1, length):
            stream[:, t] = self._successor[stream[:, t - 1]]
        return stream
