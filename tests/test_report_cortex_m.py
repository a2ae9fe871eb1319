"""cortex-m33 reports as much as the NPU targets: a row per Edge node with its MACs, the CPU op
and kernel library that runs it and its bytes; every float op an int8 program leaves on the
CPU is a recorded fallback naming its nodes (core/lower/float_ops.py), refused under strict.

The model is a face-detector backbone in the style of MTCNN's P-Net: conv, PReLU, ceil-mode
max pool (int8 end to end). Its MACs are counted here from the layer shapes, not by etforge's
counter. A 1-D conv + mean over time keeps a float op, for the fallback and strict checks.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

import etforge
from etforge.core.common.fallbacks import StrictFallback

from support import run_cli


class PNetLike(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.p1 = nn.Conv2d(3, 10, 3), nn.PReLU(10)
        self.pool = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.c2, self.p2 = nn.Conv2d(10, 16, 3), nn.PReLU(16)
        self.head = nn.Conv2d(16, 6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.p2(self.c2(self.pool(self.p1(self.c1(x))))))


SHAPE = (1, 3, 25, 25)


class MeanOverTime(nn.Module):
    """A 1-D conv, a mean over time and a linear: the mean has no int8 kernel on the Cortex-M
    yet (docs/targets.md), so it runs in float between a dequantize and a quantize."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = nn.Conv1d(4, 8, 3), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(x).mean(dim=-1))


MEAN_SHAPE = (1, 4, 20)


def _conv_macs(model: PNetLike) -> int:
    """Output elements x (in channels x kernel area), layer by layer from the shapes."""
    total, x = 0, torch.randn(SHAPE)
    for layer in (model.c1, model.p1, model.pool, model.c2, model.p2, model.head):
        x = layer(x)
        if isinstance(layer, nn.Conv2d):
            k = layer.kernel_size[0] * layer.kernel_size[1]
            total += x.numel() * layer.in_channels * k
    return total


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[PNetLike, dict, Path]:
    torch.manual_seed(0)
    model = PNetLike().eval()
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(SHAPE, generator=g),) for _ in range(2)]
    result = etforge.compile(model, calib[0], target="cortex-m33", calibration=calib)
    out = result.save(tmp_path_factory.mktemp("cm") / "out")
    return model, result.report, out


@pytest.fixture(scope="module")
def with_float(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(MEAN_SHAPE, generator=g),) for _ in range(2)]
    result = etforge.compile(MeanOverTime().eval(), calib[0], target="cortex-m33", calibration=calib)
    return result.report, result.save(tmp_path_factory.mktemp("cm") / "mean")


def test_every_node_has_a_row_with_macs_kernel_and_bytes(compiled: tuple[PNetLike, dict, Path]) -> None:
    model, report, _ = compiled
    rows = report["nodes"]
    assert report["macs"]["total"] == _conv_macs(model) > 0
    convs = [n for n in rows if n["op"] == "aten.convolution.default"]
    assert len(convs) == 3
    assert all(n["kernel"].startswith("CMSIS-NN") and n["cpu_op"].startswith("cortex_m.") for n in convs)
    assert all(n["bytes"] > 0 and n["shape"] for n in rows)
    pool = next(n for n in rows if "max_pool2d" in n["op"])
    assert pool["kernel"] and not pool["float"], pool  # a max on int8 codes: exact, not a fallback


def test_the_face_detector_runs_int8_end_to_end(compiled: tuple[PNetLike, dict, Path]) -> None:
    """Conv, PReLU and ceil-mode max pool: no float op left (PReLU's int8 form, docs/targets.md)."""
    _, report, _ = compiled
    assert not [n["node"] for n in report["nodes"] if n["float"]]
    assert not [f for f in report["fallbacks"] if f["what"] == "runs in float on the CPU"]


def test_float_ops_are_recorded_fallbacks_naming_the_nodes(with_float: tuple[dict, Path]) -> None:
    report, _ = with_float
    floats = [n for n in report["nodes"] if n["float"]]
    assert floats, "the mean over time runs in float on cortex-m33"
    named = " ".join(f["where"] for f in report["fallbacks"] if f["what"] == "runs in float on the CPU")
    for n in floats:
        assert n["node"] in named, (n["node"], report["fallbacks"])
        assert n["float_ops"] and n["kernel"], n


def test_strict_refuses_a_float_op_on_an_int8_target() -> None:
    torch.manual_seed(0)
    with pytest.raises(StrictFallback, match="runs in float on the CPU"):
        etforge.compile(MeanOverTime().eval(), (torch.randn(MEAN_SHAPE),), target="cortex-m33", strict=True)


def test_report_ops_prints_every_node(with_float: tuple[dict, Path]) -> None:
    report, out = with_float
    r = run_cli("report", str(out), "--ops", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert [x["node"] for x in rows] == [n["node"] for n in report["nodes"]]
    assert all(x["kernel"] for x in rows if x["placement"] != "npu")
    assert any("in float" in x["reason"] and "a fallback" in x["reason"] for x in rows)
