"""DenseNet-121 (Huang et al. 2017), torchvision's layout (7.98 M parameters).

Each dense layer concatenates every earlier output of its block, so the layer DAG has long edges:
a cut inside a block carries all of the block's outputs so far.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["densenet", "CONFIGS"]

# name -> (growth rate, layers per block, initial features)
CONFIGS = {"densenet121": (32, (6, 12, 24, 16), 64)}
BN_SIZE = 4


class DenseLayer(nn.Module):
    def __init__(self, cin: int, growth: int):
        super().__init__()
        self.norm1, self.relu1 = nn.BatchNorm2d(cin), nn.ReLU()
        self.conv1 = nn.Conv2d(cin, BN_SIZE * growth, 1, bias=False)
        self.norm2, self.relu2 = nn.BatchNorm2d(BN_SIZE * growth), nn.ReLU()
        self.conv2 = nn.Conv2d(BN_SIZE * growth, growth, 3, padding=1, bias=False)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        x = torch.cat(features, 1)
        return self.conv2(self.relu2(self.norm2(self.conv1(self.relu1(self.norm1(x))))))


class DenseBlock(nn.Module):
    def __init__(self, cin: int, count: int, growth: int):
        super().__init__()
        self.layers = nn.ModuleList(DenseLayer(cin + i * growth, growth) for i in range(count))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.layers:
            features.append(layer(features))
        return torch.cat(features, 1)


def _transition(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.BatchNorm2d(cin), nn.ReLU(), nn.Conv2d(cin, cout, 1, bias=False),
                         nn.AvgPool2d(2, 2))


class DenseNet(nn.Module):
    def __init__(self, growth: int, counts: tuple[int, ...], init: int, num_classes: int = 1000,
                 image_size: int = 224):
        super().__init__()
        self.input_shape = (3, image_size, image_size)
        stages: list[nn.Module] = [nn.Conv2d(3, init, 7, 2, 3, bias=False), nn.BatchNorm2d(init), nn.ReLU(),
                                   nn.MaxPool2d(3, 2, 1)]
        channels = init
        for i, count in enumerate(counts):
            stages.append(DenseBlock(channels, count, growth))
            channels += count * growth
            if i < len(counts) - 1:
                stages.append(_transition(channels, channels // 2))
                channels //= 2
        stages += [nn.BatchNorm2d(channels), nn.ReLU(), nn.AdaptiveAvgPool2d(1)]
        self.features = nn.Sequential(*stages)
        self.classifier = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def densenet(name: str, num_classes: int = 1000, image_size: int = 224) -> DenseNet:
    growth, counts, init = CONFIGS[name]
    return DenseNet(growth, counts, init, num_classes, image_size)
