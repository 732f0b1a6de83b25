"""ResNet-50 and Wide ResNet-50-2 (torchvision v1.5 layouts: 25.6M and 68.9M parameters)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Bottleneck(nn.Module):
    """1x1 -> 3x3 (stride here, as in v1.5) -> 1x1 with a projection shortcut when shapes change."""

    expansion = 4

    def __init__(self, in_ch: int, planes: int, stride: int, width: int):
        super().__init__()
        out_ch = planes * self.expansion
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out_ch)
        self.downsample = None
        if stride != 1 or in_ch != out_ch:
            self.downsample = nn.Sequential(
                nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False), nn.BatchNorm2d(out_ch)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.relu(y + shortcut)


class ResNet(nn.Module):
    """Bottleneck ResNet; ``forward(images, labels)`` returns the cross-entropy loss.

    Example:
        >>> m = ResNet(layers=(1, 1, 1, 1), num_classes=10)
        >>> m(torch.randn(2, 3, 32, 32), torch.tensor([1, 2])).shape
        torch.Size([])
    """

    def __init__(
        self, layers: tuple[int, ...] = (3, 4, 6, 3), num_classes: int = 1000, width_per_group: int = 64
    ):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages = []
        in_ch = 64
        for i, blocks in enumerate(layers):
            planes = 64 * 2**i
            width = planes * width_per_group // 64
            stage = []
            for j in range(blocks):
                stage.append(Bottleneck(in_ch, planes, 2 if (j == 0 and i > 0) else 1, width))
                in_ch = planes * Bottleneck.expansion
            stages.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_ch, num_classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(F.relu(self.bn1(self.conv1(images))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return F.cross_entropy(self.fc(torch.flatten(self.avgpool(x), 1)), labels)


def resnet50(num_classes: int = 1000) -> ResNet:
    """ResNet-50.

    Example:
        >>> sum(p.numel() for p in resnet50().parameters())
        25557032
    """
    return ResNet((3, 4, 6, 3), num_classes)


def wide_resnet50_2(num_classes: int = 1000) -> ResNet:
    """Wide ResNet-50-2 (bottleneck width doubled).

    Example:
        >>> sum(p.numel() for p in wide_resnet50_2().parameters())
        68883240
    """
    return ResNet((3, 4, 6, 3), num_classes, width_per_group=128)
