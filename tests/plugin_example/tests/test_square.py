"""The plugin proves its rewrite: ``x ** 2`` reaches LiteRT as MUL, float and int8."""

import torch

from etforge.sdk import check_op


class Square(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x**2


def test_square_is_a_mul_in_float32() -> None:
    result = check_op(Square(), (torch.randn(2, 9),), target="litert", quantize=False)
    assert "MUL" in result.litert_ops


def test_square_is_a_mul_in_int8() -> None:
    result = check_op(Square(), (torch.randn(2, 9),), target="litert")
    assert "MUL" in result.litert_ops and not result.refused
