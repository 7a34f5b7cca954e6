"""VGG-11/13/16/19 (Simonyan & Zisserman, 2015), torchvision's layout (no batch norm)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["vgg", "CONFIGS"]

CONFIGS = {
    "vgg11": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg13": [64, 64, "M", 128, 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg16": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
    "vgg19": [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512, 512, "M",
              512, 512, 512, 512, "M"],
}


class VGG(nn.Module):
    def __init__(self, config: list, num_classes: int = 1000, image_size: int = 224):
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for v in config:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(channels, v, 3, padding=1), nn.ReLU()]
                channels = v
        self.features = nn.Sequential(*layers)
        self.input_shape = (3, image_size, image_size)
        side = image_size // 32
        self.classifier = nn.Sequential(
            nn.Linear(channels * side * side, 4096), nn.ReLU(), nn.Dropout(),
            nn.Linear(4096, 4096), nn.ReLU(), nn.Dropout(), nn.Linear(4096, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def vgg(name: str, num_classes: int = 1000, image_size: int = 224) -> VGG:
    return VGG(CONFIGS[name], num_classes, image_size)
