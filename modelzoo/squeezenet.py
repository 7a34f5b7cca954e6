"""SqueezeNet 1.0 (Iandola et al. 2016), torchvision's layout (1.25 M parameters)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["squeezenet"]


class Fire(nn.Module):
    """Squeeze with 1x1 convolutions, then expand with 1x1 and 3x3 convolutions side by side."""

    def __init__(self, cin: int, squeeze: int, expand1: int, expand3: int):
        super().__init__()
        self.squeeze = nn.Sequential(nn.Conv2d(cin, squeeze, 1), nn.ReLU())
        self.expand1 = nn.Sequential(nn.Conv2d(squeeze, expand1, 1), nn.ReLU())
        self.expand3 = nn.Sequential(nn.Conv2d(squeeze, expand3, 3, padding=1), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.squeeze(x)
        return torch.cat([self.expand1(s), self.expand3(s)], 1)


class SqueezeNet(nn.Module):
    def __init__(self, num_classes: int = 1000, image_size: int = 224):
        super().__init__()
        self.input_shape = (3, image_size, image_size)
        pool = lambda: nn.MaxPool2d(3, 2, ceil_mode=True)       # noqa: E731
        self.features = nn.Sequential(
            nn.Conv2d(3, 96, 7, 2), nn.ReLU(), pool(),
            Fire(96, 16, 64, 64), Fire(128, 16, 64, 64), Fire(128, 32, 128, 128), pool(),
            Fire(256, 32, 128, 128), Fire(256, 48, 192, 192), Fire(384, 48, 192, 192),
            Fire(384, 64, 256, 256), pool(), Fire(512, 64, 256, 256))
        self.classifier = nn.Sequential(nn.Dropout(), nn.Conv2d(512, num_classes, 1), nn.ReLU(),
                                        nn.AdaptiveAvgPool2d(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.classifier(self.features(x)), 1)


def squeezenet(num_classes: int = 1000, image_size: int = 224) -> SqueezeNet:
    return SqueezeNet(num_classes, image_size)
