"""Tiny models of the architectures issue 14 names, as ``file.py:factory`` factories.

Each factory returns ``(module, example_inputs, calibration)``. They are small on purpose
(a few thousand MACs) so that compiling them on every NPU target stays fast; what matters is
the op pattern each one carries:

* ``mobilenet_v3_se``: hardswish and an SE gate closed by ``F.hardsigmoid``;
* ``shufflenet``: ``chunk`` / ``split`` / ``split_with_sizes`` and the 5-D channel shuffle;
* ``attention``: LayerNorm, q·kᵀ/√d, softmax, ·v;
* ``squeezenet``: ``max_pool2d(ceil_mode=True)`` and a fire module.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

CALIBRATION_BATCHES = 8


def _data(
    shape: tuple[int, ...], seed: int
) -> tuple[tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    g = torch.Generator().manual_seed(seed)
    example = (torch.randn(shape, generator=g),)
    calib = [(torch.randn(shape, generator=g),) for _ in range(CALIBRATION_BATCHES)]
    return example, calib


def _init(module: nn.Module, seed: int) -> nn.Module:
    """Deterministic weights and non-trivial BatchNorm statistics."""
    torch.manual_seed(seed)
    for m in module.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
        elif isinstance(m, nn.LayerNorm):
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    return module.eval()


class SqueezeExcite(nn.Module):
    """MobileNetV3's SE gate: x * hardsigmoid(fc2(relu(fc1(mean(x)))))."""

    def __init__(self, channels: int, squeezed: int) -> None:
        super().__init__()
        self.fc1 = nn.Conv2d(channels, squeezed, 1)
        self.fc2 = nn.Conv2d(squeezed, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.adaptive_avg_pool2d(x, 1)
        s = self.fc2(F.relu(self.fc1(s)))
        return x * F.hardsigmoid(s)


class MobileNetV3Block(nn.Module):
    def __init__(self, cin: int = 8, expand: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, cin, 3, padding=1), nn.BatchNorm2d(cin), nn.Hardswish())
        self.expand = nn.Sequential(nn.Conv2d(cin, expand, 1, bias=False), nn.BatchNorm2d(expand))
        self.dw = nn.Sequential(
            nn.Conv2d(expand, expand, 3, padding=1, groups=expand, bias=False), nn.BatchNorm2d(expand)
        )
        self.se = SqueezeExcite(expand, 8)
        self.project = nn.Sequential(nn.Conv2d(expand, cin, 1, bias=False), nn.BatchNorm2d(cin))
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        y = F.hardswish(self.expand(x))
        y = F.hardswish(self.dw(y))
        y = self.project(self.se(y))
        x = x + y
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


def mobilenet_v3_se() -> tuple[nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    example, calib = _data((1, 3, 12, 12), 1)
    return _init(MobileNetV3Block(), 0), example, calib


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    n, c, h, w = x.shape
    x = x.view(n, groups, c // groups, h, w)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(n, c, h, w)


class ShuffleUnit(nn.Module):
    """ShuffleNetV2's stride-1 unit: chunk, a branch on one half, concat, channel shuffle."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        half = channels // 2
        self.branch = nn.Sequential(
            nn.Conv2d(half, half, 1, bias=False),
            nn.BatchNorm2d(half),
            nn.ReLU(),
            nn.Conv2d(half, half, 3, padding=1, groups=half, bias=False),
            nn.BatchNorm2d(half),
            nn.Conv2d(half, half, 1, bias=False),
            nn.BatchNorm2d(half),
            nn.ReLU(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=1)
        return channel_shuffle(torch.cat((x1, self.branch(x2)), dim=1), 2)


class ShuffleNet(nn.Module):
    def __init__(self, channels: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU())
        self.unit1 = ShuffleUnit(channels)
        self.unit2 = ShuffleUnit(channels)
        self.mix = nn.Conv2d(channels, channels, 1)
        self.head = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.unit2(self.unit1(self.stem(x)))
        a, b = torch.split(x, [4, 12], dim=1)  # split_with_sizes
        c, d = x.split(8, dim=1)  # split
        x = self.mix(torch.cat((b, a), dim=1)) + torch.cat((d, c), dim=1)
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


def shufflenet() -> tuple[nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    example, calib = _data((1, 3, 8, 8), 2)
    return _init(ShuffleNet(), 0), example, calib


class AttentionBlock(nn.Module):
    """A pre-norm single-head self-attention block and a classifier on the first token."""

    def __init__(self, dim: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)
        self.scale = math.sqrt(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        q, k, v = self.q(h), self.k(h), self.v(h)
        att = torch.softmax(torch.bmm(q, k.transpose(1, 2)) / self.scale, dim=-1)
        x = x + self.proj(torch.bmm(att, v))
        return self.head(self.norm2(x)[:, :1].flatten(1))  # the first token, ViT-style


def attention() -> tuple[nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    example, calib = _data((1, 8, 16), 3)
    return _init(AttentionBlock(), 0), example, calib


class Fire(nn.Module):
    def __init__(self, cin: int, squeeze: int, expand: int) -> None:
        super().__init__()
        self.squeeze = nn.Conv2d(cin, squeeze, 1)
        self.e1 = nn.Conv2d(squeeze, expand, 1)
        self.e3 = nn.Conv2d(squeeze, expand, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.relu(self.squeeze(x))
        return torch.cat((F.relu(self.e1(s)), F.relu(self.e3(s))), dim=1)


class SqueezeNet(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, stride=2)
        self.fire = Fire(16, 4, 8)
        self.classifier = nn.Conv2d(16, classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.stem(x)), 3, 2, ceil_mode=True)
        x = F.max_pool2d(self.fire(x), 3, 2, ceil_mode=True)
        return F.adaptive_avg_pool2d(F.relu(self.classifier(x)), 1).flatten(1)


def squeezenet() -> tuple[nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    example, calib = _data((1, 3, 22, 22), 4)
    return _init(SqueezeNet(), 0), example, calib


CASES = {
    "mobilenet_v3_se": mobilenet_v3_se,
    "shufflenet": shufflenet,
    "attention": attention,
    "squeezenet": squeezenet,
}
