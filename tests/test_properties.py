"""Property tests: random shapes for conv, pooling, add and reshape chains convert exactly.

Each case names the LiteRT builtin it is about and requires it in the converted model
(``check_op`` alone passes a case whose op never reached LiteRT the same as one it
checked), and seeds torch from the drawn example, so a failure reproduces.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from etforge.testing import check_op

SETTINGS = settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


class Chain(torch.nn.Module):
    def __init__(self, fn, *params: torch.Tensor) -> None:  # noqa: ANN001
        super().__init__()
        self.fn = fn
        self.params = torch.nn.ParameterList([torch.nn.Parameter(p, requires_grad=False) for p in params])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x, *self.params)


def _op_converted(ops: list[str], *wanted: str) -> None:
    assert set(ops) & set(wanted), f"none of {wanted} in the LiteRT model: {ops}"


@st.composite
def conv_case(draw: st.DrawFn) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(draw(st.integers(0, 2**16)))
    c_in = draw(st.integers(1, 6))
    groups = draw(st.sampled_from([g for g in (1, 2, 3) if c_in % g == 0]))
    c_out = groups * draw(st.integers(1, 4))
    k = draw(st.integers(1, 4))
    stride = draw(st.integers(1, 3))
    dilation = draw(st.integers(1, 2))
    padding = draw(st.integers(0, k - 1))
    size = draw(st.integers((k - 1) * dilation + 1, 12))
    conv = torch.nn.Conv2d(c_in, c_out, k, stride, padding, dilation, groups)
    return conv, torch.randn(1, c_in, size, size + draw(st.integers(0, 3)))


@pytest.mark.slow  # outside the fast tier: ~20 s of random shapes (issue 47)
@given(case=conv_case(), quantize=st.booleans())
@SETTINGS
def test_conv_random_shapes(case: tuple[torch.nn.Module, torch.Tensor], quantize: bool) -> None:
    module, x = case
    result = check_op(module, (x,), quantize=quantize, atol=1e-4, rtol=1e-4)
    _op_converted(result.litert_ops, "CONV_2D", "DEPTHWISE_CONV_2D")


@pytest.mark.slow  # outside the fast tier: ~20 s of random shapes (issue 47)
@given(
    kind=st.sampled_from(["max", "avg"]),
    k=st.integers(1, 3),
    stride=st.integers(1, 3),
    size=st.integers(3, 10),
    channels=st.integers(1, 5),
    quantize=st.booleans(),
    seed=st.integers(0, 2**16),
)
@SETTINGS
def test_pool_random_shapes(
    kind: str, k: int, stride: int, size: int, channels: int, quantize: bool, seed: int
) -> None:
    torch.manual_seed(seed)
    pool = torch.nn.MaxPool2d(k, stride) if kind == "max" else torch.nn.AvgPool2d(k, stride)
    result = check_op(pool, (torch.randn(1, channels, size, size + 1),), quantize=quantize, atol=1e-5)
    _op_converted(result.litert_ops, "MAX_POOL_2D" if kind == "max" else "AVERAGE_POOL_2D")


@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    broadcast=st.booleans(),
    quantize=st.booleans(),
    seed=st.integers(0, 2**16),
)
@SETTINGS
def test_add_random_broadcast(shape: list[int], broadcast: bool, quantize: bool, seed: int) -> None:
    torch.manual_seed(seed)
    other = [1 if (broadcast and i % 2 == 0) else d for i, d in enumerate(shape)]
    module = Chain(lambda a, b: a + b, torch.randn(other))
    result = check_op(module, (torch.randn(shape),), quantize=quantize, atol=1e-5)
    _op_converted(result.litert_ops, "ADD")


@given(
    channels=st.integers(1, 6),
    size=st.integers(1, 5),
    order=st.permutations([0, 1, 2, 3]),
    quantize=st.booleans(),
    seed=st.integers(0, 2**16),
)
@SETTINGS
def test_conv_reshape_permute_chain(
    channels: int, size: int, order: list[int], quantize: bool, seed: int
) -> None:
    """A conv (NHWC inside), then a permute and a reshape: the layout algebra must stay exact."""
    torch.manual_seed(seed)
    w = torch.randn(channels, 3, 1, 1)

    def fn(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        y = F.conv2d(x, weight).permute(*order)
        return y.reshape(y.shape[0] * y.shape[1], -1)

    result = check_op(Chain(fn, w), (torch.randn(1, 3, size, size + 1),), quantize=quantize, atol=1e-5)
    _op_converted(result.litert_ops, "CONV_2D")
