"""Training data made by code, so nothing is downloaded and every rank can regenerate any minibatch.

"teacher": a seeded classification task a small model can learn: inputs x ~ N(0, 1) and labels
    argmax(x[:, :k] @ T) for a fixed random teacher matrix T over the first k input features.
"random": random inputs and labels of the same shapes, for pure throughput runs.
Minibatch `mb` of virtual worker `vw` depends only on (seed, vw, mb): the first stage makes the
inputs and the last stage the labels independently, so labels never travel through the pipeline.
"""

from __future__ import annotations

import torch

__all__ = ["DATA_MODES", "SyntheticData"]

DATA_MODES = ("teacher", "random")
_TEACHER_FEATURES = 256


class SyntheticData:
    def __init__(self, *, mode: str, seed: int, batch: int, input_shape: tuple[int, ...], num_classes: int):
        if mode not in DATA_MODES:
            raise ValueError(f"data: unknown mode {mode!r}; choose one of {', '.join(DATA_MODES)}")
        self.mode, self.seed, self.batch = mode, seed, batch
        self.input_shape, self.num_classes = tuple(input_shape), num_classes
        n_in = 1
        for d in input_shape:
            n_in *= d
        self._k = min(n_in, _TEACHER_FEATURES)
        g = torch.Generator().manual_seed(seed)
        self._teacher = torch.randn(self._k, num_classes, generator=g)

    def _generator(self, vw: int, mb: int, part: int) -> torch.Generator:
        return torch.Generator().manual_seed(((self.seed * 1_000_003 + vw) * 1_000_003 + mb) * 4 + part)

    def inputs(self, vw: int, mb: int) -> torch.Tensor:
        return torch.randn((self.batch, *self.input_shape), generator=self._generator(vw, mb, 0))

    def labels(self, vw: int, mb: int) -> torch.Tensor:
        if self.mode == "random":
            return torch.randint(self.num_classes, (self.batch,), generator=self._generator(vw, mb, 1))
        x = self.inputs(vw, mb).flatten(1)[:, :self._k]
        return (x @ self._teacher).argmax(dim=1)
