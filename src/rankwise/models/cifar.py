"""ResNet-18 for 32x32 images (He et al. 2016's basic blocks with the CIFAR stem).

A 3x3 convolution with stride 1 (no 7x7 stride-2 stem, no max pool: a 32x32 image has no
resolution to spare), then four stages of two basic blocks (two 3x3 convolutions with batch
norm) with widths ``w, 2w, 4w, 8w``; stages 2-4 halve the resolution on their first block and
project the shortcut with a strided 1x1 convolution. Global average pooling and one linear
layer finish it. With ``width=64`` and 10 classes: 11,173,962 parameters, about 0.56 GFLOPs
per 32x32 image forward.

>>> model = resnet18_cifar(num_classes=10, width=8)
>>> model(torch.zeros(2, 3, 32, 32)).shape
torch.Size([2, 10])
>>> sum(p.numel() for p in resnet18_cifar().parameters())
11173962
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from rankwise.models.resnet import check_layers, he_init, shortcut


class BasicBlock(nn.Module):
    """``x -> relu(bn(conv3x3(relu(bn(conv3x3(x))))) + shortcut(x))``.

    >>> BasicBlock(8, 16, stride=2)(torch.zeros(1, 8, 8, 8)).shape
    torch.Size([1, 16, 4, 4])
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut = shortcut(in_channels, out_channels, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """Basic-block ResNet for small images: ``layers`` blocks per stage; input
    ``(N, in_channels, H, W)`` with H, W divisible by 8; output ``(N, num_classes)``."""

    def __init__(
        self,
        layers: Sequence[int] = (2, 2, 2, 2),
        num_classes: int = 10,
        width: int = 64,
        in_channels: int = 3,
    ) -> None:
        super().__init__()
        check_layers(layers, "ResNet-18 is (2, 2, 2, 2)")
        for name, value in (("num_classes", num_classes), ("width", width)):
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} ({value!r}) must be an integer >= 1.")
        self.conv1 = nn.Conv2d(in_channels, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        channels, stages = width, []
        for stage, blocks in enumerate(layers):
            out = width * 2**stage
            stride = 1 if stage == 0 else 2
            stages.append(
                nn.Sequential(
                    *(
                        BasicBlock(channels if b == 0 else out, out, stride if b == 0 else 1)
                        for b in range(blocks)
                    )
                )
            )
            channels = out
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)
        he_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet18_cifar(num_classes: int = 10, width: int = 64) -> CifarResNet:
    """ResNet-18 on 32x32 images: (2, 2, 2, 2) basic blocks, widths ``width`` x (1, 2, 4, 8)."""
    return CifarResNet((2, 2, 2, 2), num_classes=num_classes, width=width)
