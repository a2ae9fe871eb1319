"""The host interpreter refuses what ExecuTorch's C++ kernels refuse or miscompute (dim orders),
and ``plugins/targets/dim_orders.align`` rewrites such a program into one they run.

The programs are plain ExecuTorch (``to_edge`` + ``to_executorch``) of channels-last models:
a 0-d constant added to a channels-last tensor (the portable ``add`` fails the call on the
device: ``tensors_have_same_dim_order``) and a ``cat`` of channels-last tensors (the portable
``cat`` copies rows as if contiguous: other values on the device). The outputs after ``align``
are compared with torch's, byte for byte (layout copies and ``x + c`` as a scalar add are exact).
"""

from __future__ import annotations

import pytest
import torch
from executorch.exir import to_edge

from etforge.core.common.errors import EtforgeError
from etforge.plugins.targets.dim_orders import align, problem
from etforge.runtime.execution.pte_interpreter import PteInterpreter
from etforge.sdk import KernelArg as Arg


class AddConstant(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("c", torch.tensor(3.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.c)


class CatChannels(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.cat([x, y], 1))


def _inputs(n: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(n)
    return tuple(
        torch.randn(1, 4, 3, 5, generator=g).contiguous(memory_format=torch.channels_last) for _ in range(n)
    )


def _pte(module: torch.nn.Module, example: tuple[torch.Tensor, ...], aligned: bool) -> bytes:
    edge = to_edge(torch.export.export(module.eval(), example))
    if aligned:
        notes = align(edge.exported_program())
        assert notes, "nothing to align"
    return edge.to_executorch().buffer


@pytest.mark.parametrize(
    ("module", "n", "instruction", "why"),
    [
        (AddConstant(), 1, r"\(aten::add\.out\)", "refuses tensors of different dim orders"),
        (CatChannels(), 2, r"\(aten::cat\.out\)", "indexes its tensors as if contiguous"),
    ],
    ids=["add_0d_constant", "cat_channels_last"],
)
def test_mixed_dim_orders_are_refused_then_aligned(
    module: torch.nn.Module, n: int, instruction: str, why: str
) -> None:
    example = _inputs(n)
    with pytest.raises(
        EtforgeError, match=rf"instruction \d+ {instruction} would fail .*on the device: .*{why}"
    ):
        PteInterpreter(_pte(module, example, aligned=False)).run(list(example))
    got = PteInterpreter(_pte(module, example, aligned=True)).run(list(example))
    want = module(*example)
    assert got[0].contiguous().numpy().tobytes() == want.contiguous().numpy().tobytes()


def test_contiguous_program_is_untouched() -> None:
    """NCHW programs (the NPU targets' portable kernels) break no rule: ``align`` changes nothing."""
    example = tuple(t.contiguous() for t in _inputs(2))
    edge = to_edge(torch.export.export(CatChannels().eval(), example))
    assert align(edge.exported_program()) == []


def test_rules_match_the_cpp_kernels() -> None:
    """Spot checks of the rules against ExecuTorch's sources (kernels/portable/cpu, cortex_m/ops)."""
    cl, nchw = (0, 2, 3, 1), (0, 1, 2, 3)
    x_cl, x = Arg("self", (1, 8, 4, 4), cl), Arg("self", (1, 8, 4, 4), nchw)
    out_cl, out = Arg("out", (1, 8, 4, 4), cl, True), Arg("out", (1, 8, 4, 4), nchw, True)
    scalar = Arg("other", (), ())
    assert problem("aten::add", [x_cl, scalar, out_cl])  # 0-d counts as contiguous
    assert problem("aten::add", [x, scalar, out]) is None
    assert problem("aten::add", [x_cl, Arg("other", (1, 8, 4, 4), cl), out_cl]) is None
    # broadcasting writes the output linearly: wrong for a channels-last output
    assert problem("aten::mul", [x_cl, Arg("other", (1, 8, 1, 1), cl), out_cl])
    # a 1x1 map is the same bytes in both orders
    one = Arg("tensors", (1, 8, 1, 1), cl)
    assert problem("aten::cat", [one, one, Arg("out", (1, 16, 1, 1), cl, True)]) is None
    assert problem("aten::cat", [Arg("tensors", (1, 8, 4, 4), cl), Arg("out", (1, 8, 4, 4), cl, True)])
    # max pooling checks each tensor alone (its int64 indices may be contiguous)
    pooled = Arg("out", (1, 8, 2, 2), cl, True)
    indices = Arg("out", (1, 8, 2, 2), nchw, True)
    assert problem("aten::max_pool2d_with_indices", [x_cl, pooled, indices]) is None
    # the copy op converts between orders; convolution's weight is not checked
    assert problem("dim_order_ops::_to_dim_order_copy", [x_cl, out]) is None
    assert problem("aten::convolution", [x, Arg("weight", (8, 8, 1, 1), cl), out]) is None
    # CMSIS-NN: convolutions and pools want NHWC; one channel is ambiguous, so accepted
    conv = [Arg("input", (1, 8, 4, 4), nchw), Arg("out", (1, 8, 4, 4), cl, True)]
    assert problem("cortex_m::quantized_conv2d", conv)
    assert problem("cortex_m::quantized_avg_pool2d", conv)
    assert problem("cortex_m::quantized_conv2d", [Arg("input", (1, 1, 4, 4), nchw), conv[1]]) is None
    assert problem("cortex_m::quantized_add", [x, x_cl, out]) is None
    # CMSIS-NN's transpose (arm_transpose_s8) walks memory in logical order: contiguous only
    assert problem(
        "cortex_m::transpose", [Arg("input", (1, 8, 4, 4), cl), Arg("out", (1, 8, 4, 4), nchw, True)]
    )
    assert problem("cortex_m::transpose", [Arg("input", (1, 8, 4, 4), nchw), out]) is None


class ChannelShuffle(torch.nn.Module):
    """torchvision's ShuffleNetV2 shuffle after a conv: on cortex-m33 the 5-D view's transpose
    becomes ``cortex_m::transpose`` of a tensor stored channels-last (its values were wrong
    before the rule above: 10,244 of 13,824 off in shufflenet_v2_x0_5)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        b, c, h, w = y.shape
        y = y.view(b, 2, c // 2, h, w).transpose(1, 2).contiguous().view(b, c, h, w)
        return y


def test_a_channel_shuffle_on_cortex_m33_verifies() -> None:
    import etforge

    g = torch.Generator().manual_seed(0)
    calib = [(torch.randn(1, 3, 6, 6, generator=g),) for _ in range(4)]
    compiled = etforge.compile(ChannelShuffle().eval(), calib[0], target="cortex-m33", calibration=calib)
    assert "cortex_m.transpose.default" in compiled.report["cpu_ops"], compiled.report["cpu_ops"]
    verification = compiled.verify(samples=3)
    assert verification.ok, verification.failures
