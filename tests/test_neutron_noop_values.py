"""No-op checks read constants' real values, on the path a compile takes.

ExecuTorch hands a partitioner a copy of the program whose parameters and buffers are fake
tensors (shapes, no data). A lone ``hardswish`` decomposes into ``x + 3`` (a folded constant)
and friends, and the Neutron partition rule asked whether that add is ``x + 0``: on fake data
it crashed (``Add.is_noop failed ... _local_scalar_dense``). Here the model compiles and
verifies through the CLI, and the no-op rule sees the real values on both lowering paths: a
lone ``x + 0`` stays off the NPU, a lone ``x + 1`` goes to it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from support import run_cli

TARGET = "imxrt700"


def test_lone_hardswish_compiles_and_verifies(tmp_path: Path) -> None:
    model = tmp_path / "hs.py"
    model.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.nn.functional.hardswish(x)\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        "    return M(), (torch.randn(1, 4, 8, 8),)\n"
    )
    out = tmp_path / "out"
    proc = run_cli("compile", f"{model}:build", "--target", TARGET, "-o", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert [p["name"] for p in report["partitions"]], "hardswish should reach the NPU"
    proc = run_cli("verify", str(out), "--samples", "4", "--json")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert json.loads(proc.stdout[proc.stdout.index("{") :])["ok"]


class _AddConst(torch.nn.Module):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.register_buffer("c", torch.full((1, 2, 3, 4), value))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.c


@pytest.mark.parametrize("early", [True, False], ids=["early", "classic"])
def test_noop_rule_sees_real_constants(early: bool) -> None:
    from etforge.core.build.session import compile_model

    x = (torch.randn(1, 2, 3, 4, generator=torch.Generator().manual_seed(0)),)
    decided = {}
    for value in (0.0, 1.0):
        result = compile_model(_AddConst(value), x, TARGET, calibration=[x], early=early)
        (add,) = [d for d in result.decisions if d.op == "aten.add.Tensor"]
        decided[value] = add
    assert not decided[0.0].npu and "no-op" in decided[0.0].reason, decided[0.0]
    assert decided[1.0].npu and decided[1.0].partition, decided[1.0]
