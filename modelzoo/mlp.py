"""A small multilayer perceptron: the fast chain model for executor tests on CPU."""

from __future__ import annotations

from torch import nn

__all__ = ["mlp"]


def mlp(in_features: int = 64, hidden: int = 128, depth: int = 4, num_classes: int = 10) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = in_features
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    layers.append(nn.Linear(width, num_classes))
    return nn.Sequential(*layers)
