"""Inception-v3 (Szegedy et al. 2016), torchvision's layout without the auxiliary classifier
(23.8 M parameters; the auxiliary head would make the model's output not its last operation).
Input 299x299."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["inception_v3"]


def conv(cin: int, cout: int, kernel, stride: int = 1, padding=0) -> nn.Sequential:
    """Convolution without bias, batch norm (eps 0.001), ReLU: torchvision's BasicConv2d."""
    return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, padding, bias=False),
                         nn.BatchNorm2d(cout, eps=0.001), nn.ReLU())


def _avg_pool() -> nn.AvgPool2d:
    return nn.AvgPool2d(3, 1, 1)


class InceptionA(nn.Module):
    def __init__(self, cin: int, pool_features: int):
        super().__init__()
        self.b1 = conv(cin, 64, 1)
        self.b5 = nn.Sequential(conv(cin, 48, 1), conv(48, 64, 5, padding=2))
        self.b3 = nn.Sequential(conv(cin, 64, 1), conv(64, 96, 3, padding=1), conv(96, 96, 3, padding=1))
        self.bp = nn.Sequential(_avg_pool(), conv(cin, pool_features, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b1(x), self.b5(x), self.b3(x), self.bp(x)], 1)


class InceptionB(nn.Module):
    def __init__(self, cin: int):
        super().__init__()
        self.b3 = conv(cin, 384, 3, stride=2)
        self.b3dbl = nn.Sequential(conv(cin, 64, 1), conv(64, 96, 3, padding=1), conv(96, 96, 3, stride=2))
        self.bp = nn.MaxPool2d(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b3(x), self.b3dbl(x), self.bp(x)], 1)


class InceptionC(nn.Module):
    def __init__(self, cin: int, c7: int):
        super().__init__()
        row, col = ((1, 7), (0, 3)), ((7, 1), (3, 0))
        self.b1 = conv(cin, 192, 1)
        self.b7 = nn.Sequential(conv(cin, c7, 1), conv(c7, c7, row[0], padding=row[1]),
                                conv(c7, 192, col[0], padding=col[1]))
        self.b7dbl = nn.Sequential(conv(cin, c7, 1), conv(c7, c7, col[0], padding=col[1]),
                                   conv(c7, c7, row[0], padding=row[1]), conv(c7, c7, col[0], padding=col[1]),
                                   conv(c7, 192, row[0], padding=row[1]))
        self.bp = nn.Sequential(_avg_pool(), conv(cin, 192, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b1(x), self.b7(x), self.b7dbl(x), self.bp(x)], 1)


class InceptionD(nn.Module):
    def __init__(self, cin: int):
        super().__init__()
        self.b3 = nn.Sequential(conv(cin, 192, 1), conv(192, 320, 3, stride=2))
        self.b7x3 = nn.Sequential(conv(cin, 192, 1), conv(192, 192, (1, 7), padding=(0, 3)),
                                  conv(192, 192, (7, 1), padding=(3, 0)), conv(192, 192, 3, stride=2))
        self.bp = nn.MaxPool2d(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b3(x), self.b7x3(x), self.bp(x)], 1)


class InceptionE(nn.Module):
    def __init__(self, cin: int):
        super().__init__()
        self.b1 = conv(cin, 320, 1)
        self.b3 = conv(cin, 384, 1)
        self.b3a, self.b3b = conv(384, 384, (1, 3), padding=(0, 1)), conv(384, 384, (3, 1), padding=(1, 0))
        self.b3dbl = nn.Sequential(conv(cin, 448, 1), conv(448, 384, 3, padding=1))
        self.b3dbl_a = conv(384, 384, (1, 3), padding=(0, 1))
        self.b3dbl_b = conv(384, 384, (3, 1), padding=(1, 0))
        self.bp = nn.Sequential(_avg_pool(), conv(cin, 192, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.b3(x)
        d = self.b3dbl(x)
        return torch.cat([self.b1(x), torch.cat([self.b3a(b3), self.b3b(b3)], 1),
                          torch.cat([self.b3dbl_a(d), self.b3dbl_b(d)], 1), self.bp(x)], 1)


class InceptionV3(nn.Module):
    def __init__(self, num_classes: int = 1000, image_size: int = 299):
        super().__init__()
        self.input_shape = (3, image_size, image_size)
        self.stem = nn.Sequential(
            conv(3, 32, 3, stride=2), conv(32, 32, 3), conv(32, 64, 3, padding=1), nn.MaxPool2d(3, 2),
            conv(64, 80, 1), conv(80, 192, 3), nn.MaxPool2d(3, 2))
        self.mixed = nn.Sequential(
            InceptionA(192, 32), InceptionA(256, 64), InceptionA(288, 64), InceptionB(288),
            InceptionC(768, 128), InceptionC(768, 160), InceptionC(768, 160), InceptionC(768, 192),
            InceptionD(768), InceptionE(1280), InceptionE(2048))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout()
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.dropout(torch.flatten(self.pool(self.mixed(self.stem(x))), 1)))


def inception_v3(num_classes: int = 1000, image_size: int = 299) -> InceptionV3:
    return InceptionV3(num_classes, image_size)
