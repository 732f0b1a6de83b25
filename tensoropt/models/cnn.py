"""AlexNet and VGG-16 (torchvision layouts: 61.1M and 138.4M parameters at 1000 classes)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ImageClassifier(nn.Module):
    """``features -> adaptive avg pool -> flatten -> classifier``; forward returns the loss."""

    def __init__(self, features: nn.Module, pool: int, classifier: nn.Module):
        super().__init__()
        self.features = features
        self.avgpool = nn.AdaptiveAvgPool2d(pool)
        self.classifier = classifier

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(self.avgpool(self.features(images)), 1)
        return F.cross_entropy(self.classifier(x), labels)


def alexnet(num_classes: int = 1000, dropout: float = 0.5) -> ImageClassifier:
    """AlexNet (the single-GPU variant torchvision ships).

    Example:
        >>> sum(p.numel() for p in alexnet().parameters())
        61100840
    """
    features = nn.Sequential(
        nn.Conv2d(3, 64, 11, stride=4, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(3, 2),
        nn.Conv2d(64, 192, 5, padding=2),
        nn.ReLU(),
        nn.MaxPool2d(3, 2),
        nn.Conv2d(192, 384, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(384, 256, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(256, 256, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(3, 2),
    )
    classifier = nn.Sequential(
        nn.Dropout(dropout),
        nn.Linear(256 * 36, 4096),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(4096, 4096),
        nn.ReLU(),
        nn.Linear(4096, num_classes),
    )
    return ImageClassifier(features, 6, classifier)


VGG16_LAYOUT = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M")


def vgg16(num_classes: int = 1000, dropout: float = 0.5, batch_norm: bool = False) -> ImageClassifier:
    """VGG-16 (configuration D).

    Example:
        >>> sum(p.numel() for p in vgg16().parameters())
        138357544
    """
    layers: list[nn.Module] = []
    channels = 3
    for item in VGG16_LAYOUT:
        if item == "M":
            layers.append(nn.MaxPool2d(2, 2))
            continue
        layers.append(nn.Conv2d(channels, item, 3, padding=1))
        if batch_norm:
            layers.append(nn.BatchNorm2d(item))
        layers.append(nn.ReLU())
        channels = item
    classifier = nn.Sequential(
        nn.Linear(512 * 49, 4096),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(4096, 4096),
        nn.ReLU(),
        nn.Dropout(dropout),
        nn.Linear(4096, num_classes),
    )
    return ImageClassifier(nn.Sequential(*layers), 7, classifier)
