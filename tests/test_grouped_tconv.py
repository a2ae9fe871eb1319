"""A grouped transposed convolution compiles and verifies (it used to crash the quantizer).

Its weight holds ``out/groups`` channels on the per-channel axis (1), so per-channel scales
cannot match the bias; the quantizer leaves it float (found by the differential test against
upstream, case ``tconv-groups-2``, where upstream keeps it on the CPU too).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import etforge


class GroupedTConv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pre = nn.Conv2d(3, 4, 3, padding=1)
        self.up = nn.ConvTranspose2d(4, 4, 3, stride=2, groups=2)
        self.post = nn.Conv2d(4, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.post(torch.relu(self.up(torch.relu(self.pre(x)))))


@pytest.mark.parametrize("target", ["imxrt700", "cortex-m33"])
def test_grouped_transposed_conv_compiles_and_verifies(target: str) -> None:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(1, 3, 6, 6, generator=g),) for _ in range(4)]
    compiled = etforge.compile(GroupedTConv().eval(), calib[0], target=target, calibration=calib)
    verification = compiled.verify(samples=4)
    assert verification.ok, verification.failures
    if target == "imxrt700":
        assert compiled.partitions, "the plain convolutions still go to the NPU"
        assert compiled.report["cpu_ops"].get("aten.convolution.default") == 1, compiled.report["cpu_ops"]
