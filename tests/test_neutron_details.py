"""Neutron details against upstream's NXP flow: no tensor above rank 7 on the NPU, a constant
built in ``forward`` folded into the partition (not an ``aten.full`` on the CPU feeding it),
and a chip upstream refuses refused when the target is made, even with no NPU partition."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from etforge.testing import OpCheckError, check_op

from support import run_cli


class Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2.0


def _shape(rank: int) -> tuple[int, ...]:
    return (1, 2, 3, 2, 2, 3, 2, 2)[:rank]


def test_a_rank_7_tensor_runs_on_the_npu() -> None:
    x = (torch.randn(_shape(7), generator=torch.Generator().manual_seed(0)),)
    result = check_op(Double(), x, target="imxrt700")
    assert result.delegated and "MUL" in result.litert_ops


def test_a_rank_8_tensor_stays_off_the_npu() -> None:
    """Upstream builds no tensor past rank 7 (its view converter refuses rank 8): the mul on
    a rank-8 tensor runs on the CPU, and says why."""
    x = (torch.randn(_shape(8), generator=torch.Generator().manual_seed(0)),)
    with pytest.raises(
        OpCheckError,
        match=r"nodes were not delegated:\n.*mul.*a rank-8 tensor: the neutron-c NPU takes rank <= 7",
    ):
        check_op(Double(), x, target="imxrt700")
    # the same program, on the CPU, computes the reference
    result = check_op(Double(), x, target="imxrt700", expect_delegated=False)
    assert not result.delegated and not result.litert_ops


class ScaledByConstant(torch.nn.Module):
    """A constant built in ``forward``: ``x * torch.ones(...)`` and ``aten.full``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x * torch.ones(1, 8, 4, 4)) + torch.full((1, 8, 4, 4), 0.5)


@pytest.mark.parametrize("target", ["imxrt700", "imxrt700cm"])
def test_a_constant_built_in_forward_is_folded_into_the_partition(target: str) -> None:
    from etforge.core.build.report import build_report
    from etforge.core.build.session import compile_model
    from etforge.core.registry.manager import registry

    x = (torch.randn(1, 8, 4, 4, generator=torch.Generator().manual_seed(0)),)
    result = check_op(ScaledByConstant(), x, target=target)  # every op on the NPU, through LiteRT
    assert "ADD" in result.litert_ops
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(1, 8, 4, 4, generator=g),) for _ in range(4)]
    reg = registry()
    compiled = compile_model(ScaledByConstant(), x, target, calibration=calib, reg=reg)
    report = build_report(compiled, reg, "scaled_by_constant")
    cpu = [n["op"] for n in report["nodes"] if n["placement"] != "npu"]
    assert not [op for op in cpu if "full" in op or "ones" in op], cpu
    (part,) = report["partitions"]
    assert len(part["input_dim_orders"]) == 1, part  # the model's input only: no constant enters


class SoftmaxOverWidth(torch.nn.Module):
    """A conv stores its output channels-last in the partition; the softmax is then over a
    dim that is not stored last (a partition of layout-free ops keeps the model's order, and a
    softmax over its last dim needs no TRANSPOSE at all)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(8, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.conv(x), dim=3)


def test_a_softmax_off_the_channel_axis_runs_between_transposes_on_the_npu() -> None:
    """What docs/targets.md says of it: on the NPU, after a TRANSPOSE putting W last."""
    x = (torch.randn(1, 8, 4, 6, generator=torch.Generator().manual_seed(0)),)
    result = check_op(SoftmaxOverWidth(), x, target="imxrt700")
    ops = result.litert_ops
    assert "SOFTMAX" in ops and "TRANSPOSE" in ops[: ops.index("SOFTMAX")], ops


SUBSYSTEM_MODEL = """
import torch


class Floor(torch.nn.Module):
    def forward(self, x):
        return torch.floor(x * 3.0)


def build():
    g = torch.Generator().manual_seed(0)
    calibration = [(torch.randn(1, 8, generator=g),) for _ in range(4)]
    return Floor().eval(), calibration[0], calibration
"""


@pytest.mark.slow  # outside the fast tier: SDK double subprocess compiles, ~35 s each (issue 47)
@pytest.mark.parametrize(
    ("device", "why"),
    [
        ("double-n1", "reports hardware version 1 for double-n1"),
        ("double-s", "reports double-s as a Neutron-S subsystem"),
    ],
)
def test_a_chip_upstream_refuses_is_refused_without_an_npu_partition(
    device: str, why: str, tmp_path: Path
) -> None:
    from test_neutron_target import _env, _install

    model = tmp_path / "floor_model.py"
    model.write_text(SUBSYSTEM_MODEL)
    out = tmp_path / "out"
    args = ("compile", f"{model}:build", "--target", "my-chip", "-o", str(out), "--no-cache")
    proc = run_cli(
        *args, "--option", "operators_not_to_delegate=aten.mul.Tensor", env=_env(_install(tmp_path, device))
    )
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "target 'my-chip'" in proc.stderr and why in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert not out.exists()
    # the same model on a chip upstream accepts compiles, with no NPU partition
    ok = run_cli(
        *args,
        "--option",
        "operators_not_to_delegate=aten.mul.Tensor",
        env=_env(_install(tmp_path, "double-n3")),
    )
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert (out / "model.pte").exists()
