"""``x * 2`` (an int scalar) is delegated on both lowering paths and verifies.

``to_edge`` turned the int into an int64 constant behind a float ``_to_dim_order_copy``, a
float CPU op that kept the MUL off the NPU on the classic path (found by the differential
test against upstream, case ``mul-scalar``); ``IntScalarAsFloat`` makes it ``x * 2.0``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import etforge


class IntScalars(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (1 - (x * 2 + 1)) * 3


@pytest.mark.parametrize("lowering", ["early", "classic"])
def test_int_scalar_arithmetic_runs_on_the_npu(lowering: str) -> None:
    g = torch.Generator().manual_seed(0)
    calib = [(torch.randn(1, 4, 6, 6, generator=g),) for _ in range(4)]
    compiled = etforge.compile(
        IntScalars().eval(), calib[0], target="imxrt700", calibration=calib, lowering=lowering
    )
    assert "IntScalarAsFloat" in str(compiled.report), "the rewrite is reported"
    cpu = {op for op in compiled.report["cpu_ops"] if not op.startswith(("quantized_decomposed", "operator"))}
    assert cpu == set(), compiled.report["cpu_ops"]
    verification = compiled.verify(samples=4)
    assert verification.ok, verification.failures
