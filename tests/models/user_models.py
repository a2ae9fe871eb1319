"""Model factories for the CLI tests (``file.py:factory``), good and bad."""

import torch


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        return self.fc(y.flatten(1))


def small():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(1, 3, 8, 8, generator=g),) for _ in range(8)]
    return Small().eval(), (torch.randn(1, 3, 8, 8, generator=g),), calib


def not_a_tuple():
    return Small()


def raises():
    raise RuntimeError("weights file missing")


class DataDependent(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # data-dependent control flow: torch.export rejects it
            return x * 2
        return x


def unexportable():
    return DataDependent(), (torch.randn(1, 4),)
