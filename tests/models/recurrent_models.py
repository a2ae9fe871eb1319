"""Recurrent model factories for the CLI tests (``file.py:factory``)."""

import torch
from torch import nn


class LstmSpotter(nn.Module):
    """Conv1d front, an LSTM, the last step classified: one NPU partition per time step and
    more, of different working memories."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(10, 16, 3, padding=1)
        self.rnn = nn.LSTM(16, 24, batch_first=True)
        self.fc = nn.Linear(24, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x)).transpose(1, 2)
        out, _ = self.rnn(h)
        return self.fc(out[:, -1])


def lstm_spotter():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(1, 10, 8, generator=g),) for _ in range(6)]
    return LstmSpotter().eval(), calib[0], calib
