"""Twelve small, different model factories (``file.py:factory``) for the many-models tests."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
from torch import nn

#: A file the factories append to when this variable names one: which factory ran, at what
#: niceness and under which parent process (test_batch's Ray test: the jobs ran as Ray tasks,
#: at the caller's priority).
PROBE = "ETFORGE_TEST_BATCH_PROBE"


def _probe(factory: str) -> None:
    path = os.environ.get(PROBE)
    if not path:
        return
    try:
        parent = Path(f"/proc/{os.getppid()}/comm").read_text().strip()
    except OSError:
        parent = "?"
    with open(path, "a") as f:  # one short append per job: whole lines
        f.write(f"{factory} {os.nice(0)} {parent}\n")


def _seeded(module: nn.Module, shape: tuple[int, ...], seed: int) -> tuple:
    _probe(sys._getframe(1).f_code.co_name)
    g = torch.Generator().manual_seed(seed)
    calib = [(torch.randn(*shape, generator=g),) for _ in range(4)]
    return module.eval(), (torch.randn(*shape, generator=g),), calib


def _conv(cin: int, cout: int, k: int = 3, stride: int = 1, groups: int = 1) -> nn.Module:
    return nn.Sequential(nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups), nn.ReLU())


def conv_small():
    torch.manual_seed(1)
    return _seeded(
        nn.Sequential(_conv(3, 8), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 4 * 4, 4)), (1, 3, 8, 8), 1
    )


def conv_wide():
    torch.manual_seed(2)
    return _seeded(
        nn.Sequential(_conv(3, 16), _conv(16, 16), nn.AdaptiveAvgPool2d(1), nn.Flatten()), (1, 3, 8, 8), 2
    )


def conv_strided():
    torch.manual_seed(3)
    return _seeded(nn.Sequential(_conv(3, 8, stride=2), _conv(8, 8, stride=2), nn.Flatten()), (1, 3, 8, 8), 3)


def depthwise():
    torch.manual_seed(4)
    return _seeded(nn.Sequential(_conv(4, 4, groups=4), _conv(4, 8, k=1)), (1, 4, 8, 8), 4)


def avgpool():
    torch.manual_seed(5)
    return _seeded(nn.Sequential(_conv(3, 8), nn.AvgPool2d(2), _conv(8, 8)), (1, 3, 8, 8), 5)


def kernel5():
    torch.manual_seed(6)
    return _seeded(nn.Sequential(_conv(3, 8, k=5), nn.MaxPool2d(2)), (1, 3, 8, 8), 6)


def mlp():
    torch.manual_seed(7)
    return _seeded(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)), (1, 16), 7)


def mlp_deep():
    torch.manual_seed(8)
    layers: list[nn.Module] = []
    for _ in range(3):
        layers += [nn.Linear(12, 12), nn.ReLU()]
    return _seeded(nn.Sequential(*layers, nn.Linear(12, 3)), (1, 12), 8)


class _Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = _conv(8, 8), nn.Conv2d(8, 8, 3, 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.b(self.a(x)))


def residual():
    torch.manual_seed(9)
    return _seeded(_Residual(), (1, 8, 8, 8), 9)


class _Concat(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = _conv(3, 4), _conv(3, 4, k=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.a(x), self.b(x)], dim=1)


def concat():
    torch.manual_seed(10)
    return _seeded(_Concat(), (1, 3, 8, 8), 10)


def sigmoid_head():
    torch.manual_seed(11)
    return _seeded(nn.Sequential(nn.Linear(10, 6), nn.Sigmoid()), (1, 10), 11)


def conv_linear():
    torch.manual_seed(12)
    return _seeded(
        nn.Sequential(_conv(2, 4), nn.Flatten(), nn.Linear(4 * 6 * 6, 5), nn.ReLU()), (1, 2, 6, 6), 12
    )


FACTORIES = [
    "conv_small",
    "conv_wide",
    "conv_strided",
    "depthwise",
    "avgpool",
    "kernel5",
    "mlp",
    "mlp_deep",
    "residual",
    "concat",
    "sigmoid_head",
    "conv_linear",
]
