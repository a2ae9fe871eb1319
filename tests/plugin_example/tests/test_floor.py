"""The plugin proves its converter with etforge's own testing kit."""

import torch

from etforge.sdk import check_op


class Floor(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.floor(x * 3.0)


def test_floor_float32_on_toy_target() -> None:
    result = check_op(Floor(), (torch.randn(2, 9),), target="toy-npu", quantize=False)
    assert "FLOOR" in result.litert_ops
