"""int8 forms on the Cortex-M for ops ExecuTorch's Cortex-M lowering leaves in float: each one
computes the same float model (the compile's float check), runs on a CMSIS-NN kernel, and
verifies against the quantized model in the device's arithmetic (the host gates; the same
programs run bit-exact on QEMU in tests/test_firmware.py: audio_conv1d)."""

from __future__ import annotations

import torch
from torch import nn

import etforge


class Conv1dNet(nn.Module):
    """A keyword-spotter-like stack: 1-D convs (stride, dilation, groups), BatchNorm, ReLU."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv1d(10, 16, 5, stride=2, padding=2, bias=False), nn.BatchNorm1d(16)
        self.c2 = nn.Conv1d(16, 16, 3, padding=2, dilation=2, groups=4)
        self.fc = nn.Linear(16 * 25, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.b1(self.c1(x)))
        return self.fc(torch.relu(self.c2(x)).flatten(1))


def _calibrated(model: nn.Module, shape: tuple[int, ...]) -> tuple[nn.Module, list[tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(shape, generator=g),) for _ in range(4)]
    model.train()
    with torch.no_grad():
        for (x,) in batches:  # running statistics that are not the identity
            model(x * 2 + 0.5)
    return model.eval(), batches


def test_1d_convs_run_on_cmsis_nn_in_int8() -> None:
    torch.manual_seed(0)
    model, calib = _calibrated(Conv1dNet(), (1, 10, 49))
    compiled = etforge.compile(model, calib[0], target="cortex-m33", calibration=calib, strict=True)
    report = compiled.report
    assert report["fallbacks"] == []  # strict: nothing left in float
    convs = [n for n in report["nodes"] if n["op"] == "aten.convolution.default"]
    assert len(convs) == 2 and all(n["cpu_op"] == "cortex_m.quantized_conv2d.default" for n in convs), convs
    assert report["float_equivalence"]["passed"], report["float_equivalence"]  # the same float model
    assert report["macs"]["total"] == 25 * 16 * 10 * 5 + 25 * 16 * 4 * 3 + 16 * 25 * 4
    verification = compiled.verify(samples=3)
    assert verification.ok, verification.failures
