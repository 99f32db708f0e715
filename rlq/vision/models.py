"""Image classifiers in plain PyTorch: ResNet-32 for CIFAR-10 and AlexNet for ImageNet (GST's classification runs).

No torchvision (its PyPI build does not import beside rlq's torch): both networks are written out here,
following their papers, so that their parameter counts match the published ones.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rlq.core.validation import check_positive_int


class ZeroPadShortcut(nn.Module):
    """He et al.'s option-A shortcut: subsample by ``stride`` and zero-pad the extra channels (no parameters)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        if out_channels < in_channels:
            raise ValueError(f"cannot pad {in_channels} channels down to {out_channels}")
        self.extra = out_channels - in_channels
        self.stride = stride

    def forward(self, x: Tensor) -> Tensor:
        x = x[:, :, :: self.stride, :: self.stride]
        return F.pad(x, (0, 0, 0, 0, 0, self.extra)) if self.extra else x


class BasicBlock(nn.Module):
    """Two 3x3 convolutions with batch norm and an identity (or option-A) shortcut."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        if stride != 1 or in_channels != out_channels:
            self.shortcut: nn.Module = ZeroPadShortcut(in_channels, out_channels, stride)
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """ResNet for 32x32 images (He et al. 2016, section 4.2): ``6n + 2`` layers in three stages.

    A 3x3 convolution to ``width`` channels, then three stages of ``n`` basic blocks with ``width``,
    ``2 * width`` and ``4 * width`` channels (the second and third start with stride 2), global average
    pooling and one linear layer. Shortcuts are identities, zero-padded where the width doubles (option A),
    so ResNet-32 (n = 5, width 16) has 0.46M parameters as in the paper. Any input size works (the pooling
    is global): 8x8 digits as well as 32x32 CIFAR images.
    """

    def __init__(self, depth: int = 32, num_classes: int = 10, width: int = 16, in_channels: int = 3):
        super().__init__()
        if depth < 8 or (depth - 2) % 6:
            raise ValueError(f"a CIFAR ResNet has depth 6n + 2 (20, 32, 44, 56, 110), got {depth}")
        check_positive_int("width", width)
        blocks = (depth - 2) // 6
        self.depth, self.width = depth, width
        self.conv1 = nn.Conv2d(in_channels, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        stages = []
        channels = width
        for stage in range(3):
            out_channels = width * 2**stage
            layers = []
            for index in range(blocks):
                stride = 2 if stage > 0 and index == 0 else 1
                layers.append(BasicBlock(channels, out_channels, stride))
                channels = out_channels
            stages.append(nn.Sequential(*layers))
        self.layer1, self.layer2, self.layer3 = stages
        self.fc = nn.Linear(channels, num_classes)
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        nn.init.normal_(self.fc.weight, std=0.01)
        nn.init.zeros_(self.fc.bias)

    def forward(self, x: Tensor) -> Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def resnet32(num_classes: int = 10, width: int = 16, in_channels: int = 3) -> CifarResNet:
    """Return ResNet-32 for CIFAR-10 (0.46M parameters at ``width=16``; ``width`` scales every stage)."""
    return CifarResNet(32, num_classes=num_classes, width=width, in_channels=in_channels)


class AlexNet(nn.Module):
    """AlexNet (Krizhevsky et al. 2012) in its single-tower form ("one weird trick", Krizhevsky 2014).

    Five convolutions (64, 192, 384, 256, 256 channels) with max pooling, adaptive average pooling to 6x6
    and three linear layers (4096, 4096, classes) with dropout: 61.1M parameters for 1000 classes, the
    same layout and count as torchvision's ``alexnet``. Inputs of 224x224 are standard; anything from
    about 63x63 up works.
    """

    def __init__(self, num_classes: int = 1000, dropout: float = 0.5, in_channels: int = 3):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 64, 11, stride=4, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2),
            nn.Conv2d(64, 192, 5, padding=2),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2),
            nn.Conv2d(192, 384, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(384, 256, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.Conv2d(256, 256, 3, padding=1),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(3, stride=2),
        )
        self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
        self.classifier = nn.Sequential(
            nn.Dropout(dropout),
            nn.Linear(256 * 6 * 6, 4096),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(4096, 4096),
            nn.ReLU(inplace=True),
            nn.Linear(4096, num_classes),
        )

    def forward(self, x: Tensor) -> Tensor:
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def alexnet(num_classes: int = 1000, dropout: float = 0.5) -> AlexNet:
    """Return AlexNet for ImageNet (61.1M parameters at 1000 classes)."""
    return AlexNet(num_classes=num_classes, dropout=dropout)


def count_parameters(model: nn.Module) -> int:
    """Return the number of trainable values of ``model`` as built (dense; see ``rlq.compress`` for stored)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
