"""The reference models (../shared/ZOO.md) in plain torch, seeded, with data-set BatchNorm stats.

Random weights with default BatchNorm statistics collapse deep nets to ~0 outputs, which
makes every int8 comparison pass trivially; ``_calibrate_bn`` sets the statistics from
seeded data so activations keep a healthy range.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from etforge.zoo import digits


def _bn_act(block: list[nn.Module], channels: int, act: nn.Module | None, dims: int = 2) -> list[nn.Module]:
    block.append(nn.BatchNorm2d(channels) if dims == 2 else nn.BatchNorm1d(channels))
    if act is not None:
        block.append(act)
    return block


def conv_bn(
    c_in: int,
    c_out: int,
    k: int | tuple[int, int],
    s: int = 1,
    groups: int = 1,
    act: type[nn.Module] | None = nn.ReLU,
    padding: int | tuple[int, int] | None = None,
) -> nn.Sequential:
    if padding is None:
        padding = (k - 1) // 2 if isinstance(k, int) else ((k[0] - 1) // 2, (k[1] - 1) // 2)
    layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, k, s, padding, groups=groups, bias=False)]
    return nn.Sequential(*_bn_act(layers, c_out, act() if act else None))


class CifarNet(nn.Module):
    """The NXP CIFAR-10 example net."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        )  # fmt: skip
        self.classifier = nn.Linear(64 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.classifier(torch.flatten(self.features(x), 1)), dim=1)


class InvertedResidual(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = c_in * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers.append(conv_bn(c_in, hidden, 1, act=nn.ReLU6))
        layers += [
            conv_bn(hidden, hidden, 3, stride, groups=hidden, act=nn.ReLU6),
            conv_bn(hidden, c_out, 1, act=None),
        ]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision's mobilenet_v2 architecture (width 1.0)."""

    SETTINGS = (
        (1, 16, 1, 1),
        (6, 24, 2, 2),
        (6, 32, 3, 2),
        (6, 64, 4, 2),
        (6, 96, 3, 1),
        (6, 160, 3, 2),
        (6, 320, 1, 1),
    )

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [conv_bn(3, 32, 3, 2, act=nn.ReLU6)]
        c_in = 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(c_in, c, s if i == 0 else 1, t))
                c_in = c
        layers.append(conv_bn(c_in, 1280, 1, act=nn.ReLU6))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


class MobileNetV1(nn.Module):
    """MLPerf Tiny visual wake words: MobileNetV1, width multiplier 0.25."""

    def __init__(self, alpha: float = 0.25, num_classes: int = 2) -> None:
        super().__init__()

        def ch(c: int) -> int:
            return max(8, int(c * alpha))

        plan = (
            [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2)]
            + [(512, 1)] * 5
            + [(1024, 2), (1024, 1)]
        )
        layers: list[nn.Module] = [conv_bn(3, ch(32), 3, 2)]
        c_in = ch(32)
        for c, s in plan:
            layers += [conv_bn(c_in, c_in, 3, s, groups=c_in), conv_bn(c_in, ch(c), 1)]
            c_in = ch(c)
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(c_in, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


class ResBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(conv_bn(c_in, c_out, 3, stride), conv_bn(c_out, c_out, 3, act=None))
        self.shortcut = (
            nn.Identity() if stride == 1 and c_in == c_out else conv_bn(c_in, c_out, 1, stride, act=None)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


class ResNet8(nn.Module):
    """MLPerf Tiny image classification ResNet-8."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = conv_bn(3, 16, 3)
        self.stages = nn.Sequential(ResBlock(16, 16, 1), ResBlock(16, 32, 2), ResBlock(32, 64, 2))
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.stages(self.stem(x)), 1)
        return self.fc(torch.flatten(x, 1))


class DSCNN(nn.Module):
    """MLPerf Tiny keyword spotting DS-CNN (small)."""

    def __init__(self, num_classes: int = 12) -> None:
        super().__init__()
        layers: list[nn.Module] = [conv_bn(1, 64, (10, 4), 2, padding=(5, 1))]
        for _ in range(4):
            layers += [conv_bn(64, 64, 3, groups=64), conv_bn(64, 64, 1)]
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.fc(torch.flatten(x, 1))


class AutoEncoder(nn.Module):
    """MLPerf Tiny anomaly detection: fully connected autoencoder."""

    def __init__(self, dim: int = 640) -> None:
        super().__init__()
        sizes = [dim, 128, 128, 128, 128, 8, 128, 128, 128, 128]
        layers: list[nn.Module] = []
        for a, b in zip(sizes[:-1], sizes[1:], strict=True):
            layers += [nn.Linear(a, b), nn.BatchNorm1d(b), nn.ReLU()]
        layers.append(nn.Linear(128, dim))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


@dataclass(frozen=True)
class ZooEntry:
    name: str
    build: Callable[[], nn.Module]
    input_shape: tuple[int, ...]
    description: str
    #: Real calibration samples (count -> batches) for trained models; else seeded noise.
    calibrate: Callable[[int], list[tuple[torch.Tensor, ...]]] | None = None


ZOO: dict[str, ZooEntry] = {
    e.name: e
    for e in (
        ZooEntry("cifarnet", CifarNet, (1, 3, 32, 32), "NXP CIFAR-10 example net"),
        ZooEntry("mobilenet_v2", lambda: MobileNetV2(1000), (1, 3, 224, 224), "MobileNetV2, 1000 classes"),
        ZooEntry(
            "mobilenet_v2_96", lambda: MobileNetV2(10), (1, 3, 96, 96), "MobileNetV2 at 96x96, 10 classes"
        ),
        ZooEntry("mobilenet_v1_025", MobileNetV1, (1, 3, 96, 96), "MLPerf Tiny VWW MobileNetV1 0.25"),
        ZooEntry("resnet8", ResNet8, (1, 3, 32, 32), "MLPerf Tiny image classification ResNet-8"),
        ZooEntry("ds_cnn", DSCNN, (1, 1, 49, 10), "MLPerf Tiny keyword spotting DS-CNN"),
        ZooEntry("autoencoder", AutoEncoder, (1, 640), "MLPerf Tiny anomaly detection autoencoder"),
        ZooEntry(
            "digits_cnn",
            digits.trained("digits_cnn"),
            digits.DigitsCNN.input_shape,
            "small CNN trained on scikit-learn's 8x8 digits",
            lambda count: digits.calibration("digits_cnn", count),
        ),
        ZooEntry(
            "digits_mlp",
            digits.trained("digits_mlp"),
            digits.DigitsMLP.input_shape,
            "MLP trained on scikit-learn's 8x8 digits",
            lambda count: digits.calibration("digits_mlp", count),
        ),
    )
}


def _calibrate_bn(model: nn.Module, shape: tuple[int, ...], seed: int, batches: int = 4) -> None:
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None  # cumulative average over the calibration batches
    g = torch.Generator().manual_seed(seed + 1)
    model.train()
    with torch.no_grad():
        for _ in range(batches):
            model(torch.randn((16, *shape[1:]), generator=g))
    model.eval()


def build(name: str, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A zoo model (eval mode, seeded weights, data-set BN stats) and a seeded example input."""
    if name not in ZOO:
        raise KeyError(f"unknown zoo model {name!r}; known: {', '.join(sorted(ZOO))}")
    entry = ZOO[name]
    torch.manual_seed(seed)
    model = entry.build()
    _calibrate_bn(model, entry.input_shape, seed)
    g = torch.Generator().manual_seed(seed + 2)
    return model.eval(), (torch.randn(entry.input_shape, generator=g),)


def calibration(name: str, count: int = 16, seed: int = 100) -> list[tuple[torch.Tensor, ...]]:
    """Calibration batches for a zoo model: training samples for trained models, else seeded noise."""
    calibrate = ZOO[name].calibrate
    if calibrate is not None:
        return calibrate(count)
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(ZOO[name].input_shape, generator=g),) for _ in range(count)]
