"""Partitioning: Q/DQ join their op's partition, refusals keep reasons, options are honoured."""

from __future__ import annotations

import torch

from etforge.core.build.session import compile_model
from etforge.runtime.execution.host import run_program


class TwoLinears(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.sigmoid(self.a(x)))


def _compile(options: dict[str, object], target: str = "imxrt700") -> tuple[object, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    x = (torch.randn(2, 8),)
    calib = [(torch.randn(2, 8),) for _ in range(4)]
    return compile_model(TwoLinears(), x, target, calibration=calib, options=options), x


def test_operators_not_to_delegate_splits_and_still_runs() -> None:
    result, x = _compile({"operators_not_to_delegate": ("aten.sigmoid.default",)})
    by_op = {d.op: d for d in result.decisions}
    assert not by_op["aten.sigmoid.default"].npu
    assert by_op["aten.sigmoid.default"].reason == "listed in operators_not_to_delegate"
    assert len(result.partitions) == 2  # the two linears, either side of the CPU sigmoid
    out = run_program(result.host_program, x)[0]
    ref = result.quantized_program.module()(*x)
    scale = float(next(n for n in result.host_program.graph.nodes if n.op == "output").args[0][0].args[1])
    assert float((out - ref).abs().max()) <= 1.001 * scale


def test_min_partition_ops_keeps_small_partitions_on_cpu() -> None:
    result, _ = _compile({"operators_not_to_delegate": ("aten.sigmoid.default",), "min_partition_ops": 2})
    assert not result.partitions
    assert all("min_partition_ops=2" in d.reason for d in result.decisions if d.op != "aten.sigmoid.default")
