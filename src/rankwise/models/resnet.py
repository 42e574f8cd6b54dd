"""ResNet with bottleneck blocks (He et al. 2016), the layout torchvision calls ResNet v1.5.

Stem: 7x7 convolution with stride 2, batch norm, ReLU, 3x3 max pool with stride 2. Then four
stages of bottleneck blocks (1x1 reduce, 3x3, 1x1 expand by 4, each with batch norm) with
widths 64, 128, 256 and 512; the first block of stages 2-4 halves the resolution with stride 2
on its 3x3 convolution (v1.5; v1 put it on the first 1x1) and projects its shortcut with a
strided 1x1 convolution. Global average pooling and one linear layer finish it. With
``layers=(3, 4, 6, 3)`` and 1000 classes that is ResNet-50's 25,557,032 parameters.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

EXPANSION = 4  # a bottleneck's output has 4x its inner width


def check_layers(layers: Sequence[int], example: str) -> None:
    """Four stages of at least one block each; ``example`` names a known layout."""
    if len(layers) != 4 or any(type(n) is not int or n < 1 for n in layers):
        raise ValueError(
            f"layers ({tuple(layers)!r}) must be four block counts >= 1, one per stage; {example}."
        )


def shortcut(in_channels: int, out_channels: int, stride: int) -> nn.Module:
    """A residual block's shortcut: the identity where the shape is unchanged, else a strided
    1x1 convolution with batch norm."""
    if stride == 1 and in_channels == out_channels:
        return nn.Identity()
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
        nn.BatchNorm2d(out_channels),
    )


def he_init(model: nn.Module) -> None:
    """He initialisation of every convolution (for ReLU networks); batch norms start as the
    identity."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(module, nn.BatchNorm2d):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)


class Bottleneck(nn.Module):
    """``x -> relu(bn(conv1x1(relu(bn(conv3x3(relu(bn(conv1x1(x)))))))) + shortcut(x))``.

    >>> block = Bottleneck(64, 32, stride=2)
    >>> block(torch.zeros(1, 64, 8, 8)).shape
    torch.Size([1, 128, 4, 4])
    """

    def __init__(self, in_channels: int, width: int, stride: int = 1) -> None:
        super().__init__()
        out_channels = width * EXPANSION
        self.conv1 = nn.Conv2d(in_channels, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_channels, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        # The identity only fits when shape is unchanged; otherwise project with a 1x1 conv.
        self.downsample = shortcut(in_channels, out_channels, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + self.downsample(x))


class ResNet(nn.Module):
    """A bottleneck ResNet: ``layers`` blocks per stage, ``num_classes`` logits.

    Input ``(N, in_channels, H, W)`` with H, W >= 32 (the stem and stages divide by 32);
    output ``(N, num_classes)``.

    >>> model = ResNet((1, 1, 1, 1), num_classes=10)
    >>> model(torch.zeros(2, 3, 32, 32)).shape
    torch.Size([2, 10])
    """

    def __init__(
        self, layers: Sequence[int], num_classes: int = 1000, in_channels: int = 3
    ) -> None:
        super().__init__()
        check_layers(layers, "ResNet-50 is (3, 4, 6, 3)")
        for name, value in (("num_classes", num_classes), ("in_channels", in_channels)):
            if type(value) is not int or value < 1:
                raise ValueError(f"{name} ({value!r}) must be an integer >= 1.")
        self.conv1 = nn.Conv2d(in_channels, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        channels = 64
        stages = []
        for stage, (blocks, width) in enumerate(zip(layers, (64, 128, 256, 512), strict=True)):
            stride = 1 if stage == 0 else 2  # the stem already halved twice
            stage_blocks = []
            for block in range(blocks):
                stage_blocks.append(Bottleneck(channels, width, stride if block == 0 else 1))
                channels = width * EXPANSION
            stages.append(nn.Sequential(*stage_blocks))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)
        he_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet50(num_classes: int = 1000, in_channels: int = 3) -> ResNet:
    """ResNet-50: bottleneck stages of (3, 4, 6, 3) blocks, 25.6 M parameters at 1000 classes.

    >>> resnet50(num_classes=10)(torch.zeros(2, 3, 32, 32)).shape
    torch.Size([2, 10])
    """
    return ResNet((3, 4, 6, 3), num_classes=num_classes, in_channels=in_channels)


# The TensorBrain guide's spelling, ``tb.nn.ResNet50()``.
ResNet50 = resnet50
