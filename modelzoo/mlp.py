"""A small multilayer perceptron: the fast chain model for executor tests on CPU."""

from __future__ import annotations

from torch import nn

__all__ = ["mlp", "MLP"]


class MLP(nn.Sequential):
    """`depth` hidden Linear+ReLU layers then a classifier; `input_shape` tells build() its input."""

    def __init__(self, in_features: int = 64, hidden: int = 128, depth: int = 4, num_classes: int = 10):
        layers: list[nn.Module] = []
        width = in_features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, num_classes))
        super().__init__(*layers)
        self.input_shape = (in_features,)


def mlp(in_features: int = 64, hidden: int = 128, depth: int = 4, num_classes: int = 10) -> MLP:
    return MLP(in_features, hidden, depth, num_classes)
