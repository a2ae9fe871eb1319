"""The device simulation's in-place (de)quantizes (``simulate_batched._quantize``,
``_dequantize``) give torch's own ops' values bit for bit, laid out as torch lays them out:
on ties, values past the range, infinities, both code types and channels-last stacks; and
they decline (torch's op then runs) where the arguments are not the plain case."""

from __future__ import annotations

import pytest
import torch
import torch.ao.quantization.fx._decomposed  # noqa: F401 - registers quantized_decomposed

from etforge.runtime.verification.simulate_batched import _dequantize, _quantize

QUANTIZE = torch.ops.quantized_decomposed.quantize_per_tensor.default
DEQUANTIZE = torch.ops.quantized_decomposed.dequantize_per_tensor.default


def _values(seed: int, scale: float = 0.0625) -> torch.Tensor:
    """Random values, the ties of every code on ``scale``'s grid (float32: a multiply by the
    reciprocal and a division round them differently), infinities and values past the range."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 8, 5, 7, generator=g) * 40
    flat = x.view(-1)
    flat[:260] = (torch.arange(-130, 130, dtype=torch.float32) + 0.5) * torch.tensor(
        scale, dtype=torch.float32
    )
    flat[260:268] = torch.tensor([float("inf"), float("-inf"), 1e9, -1e9, 127.4999, -128.5, 2.5, 3.5])
    return x


@pytest.mark.parametrize(
    "dtype,lo,hi", [(torch.int8, -128, 127), (torch.int8, -127, 127), (torch.uint8, 0, 255)]
)
@pytest.mark.parametrize("channels_last", [False, True])
def test_quantize_in_place_is_torchs(dtype: torch.dtype, lo: int, hi: int, channels_last: bool) -> None:
    for seed, (scale, zp) in enumerate([(0.0625, 0), (0.031, 3), (1 / 3, -5), (0.5, 128)]):
        if dtype is torch.int8 and zp == 128:
            zp = 127
        x = _values(seed, scale)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        want = QUANTIZE(x, scale, zp, lo, hi, dtype)
        found = _quantize(x, scale, zp, lo, hi, dtype)
        assert found is not None
        assert found.dtype == want.dtype and torch.equal(found, want) and found.stride() == want.stride()


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
@pytest.mark.parametrize("channels_last", [False, True])
def test_dequantize_in_place_is_torchs(dtype: torch.dtype, channels_last: bool) -> None:
    lo, hi = (-128, 127) if dtype is torch.int8 else (0, 255)
    codes = (
        torch.arange(lo, hi + 1, dtype=torch.int32).repeat(30)[: 3 * 8 * 5 * 7].reshape(3, 8, 5, 7).to(dtype)
    )
    if channels_last:
        codes = codes.contiguous(memory_format=torch.channels_last)
    for scale, zp in [(0.0625, 0), (0.031, 3), (1 / 3, -5), (1e-7, 100)]:
        want = DEQUANTIZE(codes, scale, zp, lo, hi, dtype)
        found = _dequantize(codes, scale, zp, lo, hi, dtype)
        assert found is not None
        assert found.dtype == want.dtype and torch.equal(found, want) and found.stride() == want.stride()
        assert torch.equal(_dequantize(codes, scale, zp, lo, hi, dtype, out_dtype=torch.float32), want)


def test_other_arguments_run_torchs_op() -> None:
    x = _values(0)
    assert _quantize(x.double(), 0.1, 0, -128, 127, torch.int8) is None  # float64 input
    assert _quantize(x, torch.tensor(0.1), 0, -128, 127, torch.int8) is None  # a tensor scale
    assert _quantize(x, 0.1, 0, -129, 127, torch.int8) is None  # past the type: torch's check raises
    assert _quantize(x, 0.1, 0, -128, 127, torch.int16) is None
    codes = torch.zeros(2, 3, dtype=torch.int8)
    assert _dequantize(codes, 0.1, 0, -128, 127, torch.uint8) is None  # not the codes' type
    assert _dequantize(codes, 0.1, 0, -128, 127, torch.int8, out_dtype=torch.float16) is None
