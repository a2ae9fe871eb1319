"""int8 forms on the Cortex-M for ops ExecuTorch's Cortex-M lowering leaves in float: each one
computes the same float model (the compile's float check), runs on a CMSIS-NN kernel, and
verifies against the quantized model in the device's arithmetic (the host gates; the same
programs run bit-exact on QEMU: audio_conv1d in tests/test_firmware.py, the face detector here)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
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
    with torch.no_grad():  # running statistics that are not the identity
        model(torch.cat([x for (x,) in batches]) * 2 + 0.5)
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


class PNetLike(nn.Module):
    """A face detector's first stage in the MTCNN style: conv, per-channel PReLU, ceil-mode
    max pool, then conv heads (a scalar-alpha PReLU too)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.p1 = nn.Conv2d(3, 10, 3), nn.PReLU(10)
        self.pool = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.c2, self.p2 = nn.Conv2d(10, 16, 3), nn.PReLU(16)
        self.c3, self.p3 = nn.Conv2d(16, 32, 3), nn.PReLU()
        self.head = nn.Conv2d(32, 6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.p1(self.c1(x)))
        return self.head(self.p3(self.c3(self.p2(self.c2(x)))))


def _pnet() -> tuple[nn.Module, list[tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    model = PNetLike().eval()
    with torch.no_grad():  # trained PReLUs have distinct slopes, not the 0.25 default
        for p in (model.p1, model.p2, model.p3):
            p.weight.uniform_(0.05, 0.6)
    g = torch.Generator().manual_seed(1)
    return model, [(torch.randn((1, 3, 25, 25), generator=g),) for _ in range(4)]


def test_a_face_detector_of_conv_prelu_and_ceil_mode_pools_runs_int8() -> None:
    model, calib = _pnet()
    compiled = etforge.compile(model, calib[0], target="cortex-m33", calibration=calib, strict=True)
    report = compiled.report
    assert report["fallbacks"] == [] and not [n for n in report["nodes"] if n["float"]]
    assert report["float_equivalence"]["passed"], report["float_equivalence"]
    ops = report["cpu_ops"]
    assert ops.get("cortex_m.quantized_mul.default") == 3, ops  # one per PReLU
    assert not [
        op for op in ops if op.startswith("aten.") and ("where" in op or "gt" in op or "mul" in op)
    ], ops
    verification = compiled.verify(samples=3)
    assert verification.ok, verification.failures


def test_the_face_detector_is_bit_exact_on_qemu(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The device computes what the host interpreter computes (one firmware image)."""
    from test_firmware import _missing

    if _missing() is not None:
        pytest.skip(str(_missing()))
    from etforge.runtime.firmware import build, device

    os.environ.setdefault(build.ENV_CACHE, str(request.config.cache.mkdir("etforge-firmware")))
    model, calib = _pnet()
    compiled = etforge.compile(model, calib[0], target="cortex-m33", calibration=calib)
    out = compiled.save(tmp_path / "pnet")
    compiled.codegen(out / "codegen")
    v = device.verify(out, "qemu-m33", samples=2)
    assert v.failures == [] and v.identical == v.samples == 2, v.failures
    assert v.planned == v.report_arena


class LooseBatchNorms(nn.Module):
    """BatchNorms no layer folds: on the raw 2-D features, and on a transposed 3-D sequence."""

    def __init__(self) -> None:
        super().__init__()
        self.bn_in, self.fc1 = nn.BatchNorm1d(12), nn.Linear(12, 24)
        self.bn_seq, self.fc2 = nn.BatchNorm1d(4), nn.Linear(4 * 6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.fc1(self.bn_in(x)))  # [N, 24]
        seq = self.bn_seq(h.reshape(-1, 6, 4).transpose(1, 2))  # [N, 4, 6], BN over the 4 channels
        return self.fc2(seq.flatten(1))


def test_batch_norms_no_layer_folds_run_int8() -> None:
    model, calib = _calibrated(LooseBatchNorms(), (1, 12))
    compiled = etforge.compile(model, calib[0], target="cortex-m33", calibration=calib, strict=True)
    report = compiled.report
    assert report["fallbacks"] == [] and report["float_equivalence"]["passed"], report["float_equivalence"]
    ops = report["cpu_ops"]
    assert ops.get("cortex_m.quantized_linear.default") == 3, ops  # fc1, fc2 and the diagonal one
    assert any("conv2d" in op for op in ops), ops  # the 3-D one: a depthwise 1x1 conv
    assert compiled.verify(samples=3).ok
