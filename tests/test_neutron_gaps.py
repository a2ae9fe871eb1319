"""Ops upstream's Neutron partitioner delegates that etforge kept on the CPU before: a
transposed convolution whose output_padding exceeds its padding, amax / amin, and reflect
padding (MIRROR_PAD). Each runs on the NPU side and, through LiteRT, within one output step of
the PT2E quantized reference (``check_op``, both LiteRT kernel sets)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from etforge.testing import check_op

TARGET = "imxrt700"
#: Output steps from the quantized reference: one rounding apart (the check_op contract).
MAX_STEPS = 1.0


class _Fn(torch.nn.Module):
    def __init__(self, fn: object, mods: dict[str, torch.nn.Module] | None = None) -> None:
        super().__init__()
        self.fn = fn
        self.mods = torch.nn.ModuleDict(mods or {})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(self.mods, x)  # type: ignore[operator]


CASES = {
    "tconv-output-padding-gt-padding": (
        _Fn(lambda m, x: m["t"](x), {"t": torch.nn.ConvTranspose2d(2, 3, 3, stride=2, output_padding=1)}),
        (1, 2, 4, 4),
        "TRANSPOSE_CONV",
    ),
    "tconv-output-padding-1d": (
        _Fn(lambda m, x: m["t"](x), {"t": torch.nn.ConvTranspose1d(2, 3, 2, stride=2, output_padding=1)}),
        (1, 2, 5),
        "TRANSPOSE_CONV",
    ),
    "amax-keepdim": (_Fn(lambda m, x: x.amax(1, keepdim=True)), (1, 4, 5, 5), "REDUCE_MAX"),
    "amax-spatial": (_Fn(lambda m, x: x.amax((2, 3))), (1, 4, 5, 5), "REDUCE_MAX"),
    "amin-last": (_Fn(lambda m, x: x.amin(-1)), (1, 4, 6), "REDUCE_MIN"),
    "pad-reflect-2d": (_Fn(lambda m, x: F.pad(x, (1, 2, 2, 1), mode="reflect")), (1, 3, 5, 5), "MIRROR_PAD"),
    "pad-reflect-1d": (_Fn(lambda m, x: F.pad(x, (2, 1), mode="reflect")), (1, 3, 6), "MIRROR_PAD"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_gap_closed(case: str) -> None:
    module, shape, litert_op = CASES[case]
    torch.manual_seed(0)
    x = (torch.randn(shape, generator=torch.Generator().manual_seed(1)),)
    result = check_op(module, x, target=TARGET, max_steps=MAX_STEPS)
    assert litert_op in result.litert_ops, result.litert_ops


def test_replicate_pad_stays_on_the_cpu() -> None:
    from etforge.core.build.session import compile_model

    x = (torch.randn(1, 2, 4, 4, generator=torch.Generator().manual_seed(1)),)
    result = compile_model(
        _Fn(lambda m, x: F.pad(x, (1, 1, 1, 1), mode="replicate")), x, TARGET, calibration=[x]
    )
    assert not result.partitions
    assert not any(d.npu for d in result.decisions)
