"""Grouped convolutions on the Neutron NPU, as ExecuTorch's NXP backend places them.

Upstream splits a grouped convolution with 2 to 10 groups (not depthwise) into one
convolution per group and a concatenation (``aten_passes/split_group_convolution.py``) and
converts one with more groups as a grouped Conv2D; etforge's ``grouped_conv`` rewrite does the
same from the target's data (``max_split_groups``), folding a following batch norm into the
branches. Proven here by placement on both lowering paths, by ``etforge verify`` (the
compiled program against the float model and the quantized reference, through LiteRT), and
by torchvision's regnet_x_400mf (groups 2, 4, 10 and 25) landing in one NPU partition.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
import torch

from support import run_cli

TARGET = "imxrt700"

MODEL = """
import torch


class Grouped(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Conv2d(8, 8, 3, padding=1, groups=2, bias=False)  # split, BN folded
        self.bn = torch.nn.BatchNorm2d(8)
        self.b = torch.nn.Conv2d(8, 24, 3, groups=4)  # split: 2 in, 6 out per group
        self.c = torch.nn.Conv2d(24, 24, 3, padding=1, groups=12)  # > 10 groups: one grouped conv
        self.d = torch.nn.Conv2d(24, 24, 3, groups=24)  # depthwise: as it is

    def forward(self, x):
        y = torch.relu(self.bn(self.a(x)))
        return self.d(torch.relu(self.c(self.b(y))))


def build():
    torch.manual_seed(0)
    m = Grouped().eval()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-0.5, 0.5)
        m.bn.running_var.uniform_(0.5, 2.0)
        m.bn.weight.uniform_(0.5, 1.5)
        m.bn.bias.uniform_(-0.2, 0.2)
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(1, 8, 12, 12, generator=g),) for _ in range(8)]
    return m, calib[0], calib
"""


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("grouped") / "grouped.py"
    path.write_text(MODEL)
    return path


def _build(
    model_file: Path,
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    namespace: dict[str, object] = {}
    exec(compile(model_file.read_text(), str(model_file), "exec"), namespace)
    return namespace["build"]()  # type: ignore[operator,no-any-return]


@pytest.mark.parametrize("early", [True, False], ids=["early", "classic"])
def test_every_grouped_conv_is_on_the_npu(model_file: Path, early: bool) -> None:
    from etforge.core.build.session import compile_model

    model, example, calib = _build(model_file)
    result = compile_model(model, example, TARGET, calibration=calib, early=early)
    off = [(d.node, d.reason) for d in result.decisions if not d.npu]
    assert not off, off
    assert len(result.partitions) == 1
    convs = [d for d in result.decisions if d.op == "aten.convolution.default"]
    # a: 2 branches, b: 4 branches, c and d whole
    assert len(convs) == 2 + 4 + 1 + 1, [d.node for d in convs]
    ops = result.partitions[0].converted.operators
    assert ops.count("CONV_2D") == 7 and ops.count("DEPTHWISE_CONV_2D") == 1 and "CONCATENATION" in ops


def test_split_grouped_convs_verify(model_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_cli("compile", f"{model_file}:build", "--target", TARGET, "-o", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    notes = json.loads((out / "report.json").read_text())
    assert "SplitGroupedConv" in json.dumps(notes)  # the report says the rewrite ran
    proc = run_cli("verify", str(out), "--samples", "4", "--json")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert json.loads(proc.stdout[proc.stdout.index("{") :])["ok"]


def test_litert_target_keeps_grouped_convs_whole(model_file: Path) -> None:
    """The split is Neutron's (target data): LiteRT runs grouped convs as they are."""
    from etforge.core.build.session import compile_model

    model, example, calib = _build(model_file)
    result = compile_model(model, example, "litert", calibration=calib)
    convs = [d for d in result.decisions if d.op == "aten.convolution.default"]
    assert len(convs) == 4 and all(d.npu for d in convs)


def test_regnet_x_400mf_is_one_partition() -> None:
    for name in ("torchvision._meta_registrations", "torchvision._autograd_registrations"):
        sys.modules.setdefault(name, types.ModuleType(name))
    import torchvision

    from etforge.core.build.session import compile_model

    torch.manual_seed(0)
    model = torchvision.models.regnet_x_400mf(num_classes=10).eval()
    for module in model.modules():  # in-place ReLU: functionalized by the front end (issue 23)
        if hasattr(module, "inplace"):
            module.inplace = False
    x = (torch.randn(1, 3, 64, 64, generator=torch.Generator().manual_seed(1)),)
    result = compile_model(model, x, TARGET, calibration=[x])
    off = [(d.node, d.op, d.reason) for d in result.decisions if not d.npu]
    assert not off, off[:5]
    assert len(result.partitions) == 1
