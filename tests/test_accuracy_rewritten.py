"""``verify --data`` on a model a rewrite changed: the float model the accuracy is measured on is
the compiled model as the user wrote it, not the program verify's float check lowered.

Division by a constant buffer is rewritten to multiplication by its reciprocal (the rewrite
adds a constant, ``_rw_reciprocal``). The float check used to lower the loaded float program in
place, so the accuracy step then failed to rebuild its module (KeyError '_rw_reciprocal').
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

import etforge
from etforge.runtime.verification.verify import verify


class Scaled(nn.Module):
    """Raw sensor values divided by their full-scale range, then classified."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("full_scale", torch.tensor([[2.0, 4.0, 8.0, 16.0]]))
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x / self.full_scale)


def test_verify_data_on_a_division_by_a_constant_buffer(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Scaled().eval()
    x = torch.rand(24, 4) * torch.tensor([2.0, 4.0, 8.0, 16.0])
    with torch.no_grad():
        y = model(x).argmax(1)  # labels: the eager float model's own classes
    calibration = [(x[i : i + 1],) for i in range(8)]
    compiled = etforge.compile(model, calibration[0], target="imxrt700cm", calibration=calibration)
    data = tmp_path / "data.npz"
    np.savez(data, x=x.numpy(), y=y.numpy())
    result = verify(compiled.save(tmp_path / "out"), samples=4, data=str(data), max_accuracy_drop=100.0)
    assert result.ok, result.failures
    assert result.float_accuracy == 100.0  # the float model evaluated is the model itself
    assert result.compiled_accuracy is not None
