"""A small model with the ops the zoo lacks (concat, mul, sigmoid, depthwise conv, average
pool, residual add), for ``tests/test_verify_saved_program.py`` (``file.py:factory``)."""

import torch


class Mixed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.dw = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pw = torch.nn.Conv2d(16, 8, 1)
        self.fc = torch.nn.Linear(8 * 4 * 4, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.relu(self.stem(x))
        b = self.dw(a) * torch.sigmoid(a)
        c = torch.relu(self.pw(torch.cat([a, b], dim=1))) + a
        d = torch.nn.functional.avg_pool2d(c, 2)
        return torch.softmax(self.fc(d.flatten(1)), dim=1)


def mixed():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(1, 3, 8, 8, generator=g),) for _ in range(8)]
    return Mixed().eval(), (torch.randn(1, 3, 8, 8, generator=g),), calib
