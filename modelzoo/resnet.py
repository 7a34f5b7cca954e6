"""ResNet-18/50/101/152 and ResNeXt-50/101 (He et al. 2016; Xie et al. 2017), torchvision's layout."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["resnet", "SPECS"]

# name -> (block, blocks per stage, groups, width per group)
SPECS = {
    "resnet18": ("basic", [2, 2, 2, 2], 1, 64),
    "resnet34": ("basic", [3, 4, 6, 3], 1, 64),
    "resnet50": ("bottleneck", [3, 4, 6, 3], 1, 64),
    "resnet101": ("bottleneck", [3, 4, 23, 3], 1, 64),
    "resnet152": ("bottleneck", [3, 8, 36, 3], 1, 64),
    "resnext50": ("bottleneck", [3, 4, 6, 3], 32, 4),
    "resnext101": ("bottleneck", [3, 4, 23, 3], 32, 8),
}


class Basic(nn.Module):
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int, groups: int, width: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.down = _downsample(cin, planes, stride)
        self.relu2 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        return self.relu2(out + (self.down(x) if self.down is not None else x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int, groups: int, width_per_group: int):
        super().__init__()
        width = int(planes * width_per_group / 64) * groups
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, groups=groups, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.relu2 = nn.ReLU()
        self.conv3 = nn.Conv2d(width, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.down = _downsample(cin, planes * 4, stride)
        self.relu3 = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu1(self.bn1(self.conv1(x)))
        out = self.relu2(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu3(out + (self.down(x) if self.down is not None else x))


def _downsample(cin: int, cout: int, stride: int) -> nn.Module | None:
    if stride == 1 and cin == cout:
        return None
    return nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))


class ResNet(nn.Module):
    def __init__(self, block: str, counts: list[int], groups: int, width: int, num_classes: int = 1000):
        super().__init__()
        cls = Basic if block == "basic" else Bottleneck
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64),
                                  nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], 64
        for i, (planes, count) in enumerate(zip([64, 128, 256, 512], counts)):
            for j in range(count):
                blocks.append(cls(cin, planes, 2 if (i > 0 and j == 0) else 1, groups, width))
                cin = planes * cls.expansion
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))


def resnet(name: str, num_classes: int = 1000, image_size: int = 224) -> ResNet:
    block, counts, groups, width = SPECS[name]
    model = ResNet(block, counts, groups, width, num_classes)
    model.input_shape = (3, image_size, image_size)     # any size >= 32 works (adaptive pooling)
    return model
