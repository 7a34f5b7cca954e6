"""AlexNet (Krizhevsky et al. 2012), torchvision's single-tower layout (61.1 M parameters)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["alexnet"]


class AlexNet(nn.Module):
    def __init__(self, num_classes: int = 1000, image_size: int = 224):
        super().__init__()
        self.input_shape = (3, image_size, image_size)
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 11, 4, 2), nn.ReLU(), nn.MaxPool2d(3, 2),
            nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2),
            nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(),
            nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(),
            nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(), nn.MaxPool2d(3, 2))
        self.pool = nn.AdaptiveAvgPool2d(6)
        self.classifier = nn.Sequential(
            nn.Dropout(), nn.Linear(256 * 6 * 6, 4096), nn.ReLU(),
            nn.Dropout(), nn.Linear(4096, 4096), nn.ReLU(), nn.Linear(4096, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


def alexnet(num_classes: int = 1000, image_size: int = 224) -> AlexNet:
    return AlexNet(num_classes, image_size)
