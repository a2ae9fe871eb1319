"""Single-op modules at each side of each limit upstream's Neutron partitioner checks.

Shared by ``test_neutron_differential.py`` (etforge's decisions) and
``sdk_double/upstream_partition.py`` (upstream's, in a child): torch only, so the child can
import it beside ExecuTorch's NXP backend without etforge. ``op`` is the Edge op whose nodes'
placement is compared; inputs are seeded (``inputs``), so both sides calibrate on the same data.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F  # noqa: N812


@dataclass
class DCase:
    id: str
    op: str
    shapes: tuple[tuple[int, ...], ...]
    fn: Callable[..., torch.Tensor]
    mods: Callable[[], dict[str, torch.nn.Module]] = field(default=dict)
    positive: bool = False  # inputs in [0, 1): an asymmetric quantizer gives zero point -128
    also: tuple[str, ...] = ()  # further ops standing for the case's op on one side (a rewrite's)


class Module(torch.nn.Module):
    def __init__(self, case: DCase) -> None:
        super().__init__()
        self.case = case
        torch.manual_seed(0)
        self.m = torch.nn.ModuleDict(case.mods())

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return self.case.fn(self.m, *xs)


def inputs(case: DCase, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return tuple(
        torch.rand(s, generator=g) if case.positive else torch.randn(s, generator=g) for s in case.shapes
    )


def matches(case: DCase, op: str) -> bool:
    """Whether a compute node of op ``op`` is one whose placement the case compares."""
    return op == case.op or op in case.also


def _m(**mods: Callable[[], torch.nn.Module]) -> Callable[[], dict[str, torch.nn.Module]]:
    return lambda: {k: f() for k, f in mods.items()}


def _run(m: dict[str, torch.nn.Module], x: torch.Tensor) -> torch.Tensor:
    return m["m"](x)


CONV = "aten.convolution.default"
W = 4097  # one past the Neutron kernel / stride limit (4096)
IMG = ((1, 4, 8, 8),)

CASES: list[DCase] = [
    # -- convolution ------------------------------------------------------------------------
    DCase("conv-plain", CONV, IMG, _run, _m(m=lambda: torch.nn.Conv2d(4, 6, 3))),
    DCase("conv-stride-2-pad-1", CONV, IMG, _run, _m(m=lambda: torch.nn.Conv2d(4, 6, 3, stride=2, padding=1))),
    DCase("conv-dilation-2", CONV, IMG, _run, _m(m=lambda: torch.nn.Conv2d(4, 6, 3, dilation=2))),
    DCase("conv-stride-4097", CONV, ((1, 2, 1, W + 1),), _run, _m(m=lambda: torch.nn.Conv2d(2, 2, 1, stride=(1, W)))),
    DCase("conv-weight-rows-65520", CONV, ((1, 7280, 3, 3),), _run, _m(m=lambda: torch.nn.Conv2d(7280, 1, 3))),
    DCase("conv-weight-rows-65664", CONV, ((1, 7281, 3, 3),), _run, _m(m=lambda: torch.nn.Conv2d(7281, 1, 3))),
    DCase("conv-depthwise", CONV, IMG, _run, _m(m=lambda: torch.nn.Conv2d(4, 4, 3, groups=4))),
    DCase("conv-groups-2", CONV, IMG, _run, _m(m=lambda: torch.nn.Conv2d(4, 6, 3, groups=2))),
    DCase("conv-depth-multiplier-2", CONV, IMG, _run, _m(m=lambda: torch.nn.Conv2d(4, 8, 3, groups=4))),
    DCase("conv-depth-multiplier-3", CONV, IMG, _run, _m(m=lambda: torch.nn.Conv2d(4, 12, 3, groups=4))),
    DCase("conv-groups-12", CONV, ((1, 24, 6, 6),), _run, _m(m=lambda: torch.nn.Conv2d(24, 24, 3, groups=12))),
    DCase("conv1d", CONV, ((1, 4, 10),), _run, _m(m=lambda: torch.nn.Conv1d(4, 6, 3))),
    DCase("tconv-stride-2", CONV, IMG, _run, _m(m=lambda: torch.nn.ConvTranspose2d(4, 4, 3, stride=2))),
    DCase("tconv-stride-3", CONV, IMG, _run, _m(m=lambda: torch.nn.ConvTranspose2d(4, 4, 3, stride=3))),
    DCase("tconv-output-padding-1", CONV, IMG, _run,
          _m(m=lambda: torch.nn.ConvTranspose2d(4, 4, 3, stride=2, output_padding=1))),
    DCase("tconv-padding-eq-kernel", CONV, IMG, _run, _m(m=lambda: torch.nn.ConvTranspose2d(4, 4, 3, padding=3))),
    DCase("tconv-groups-2", CONV, IMG, _run, _m(m=lambda: torch.nn.ConvTranspose2d(4, 4, 3, groups=2))),
    # -- pooling ----------------------------------------------------------------------------
    DCase("maxpool-2", "aten.max_pool2d_with_indices.default", IMG, lambda m, x: F.max_pool2d(x, 2)),
    DCase("maxpool-3-stride-2-pad-1", "aten.max_pool2d_with_indices.default", IMG, lambda m, x: F.max_pool2d(x, 3, 2, 1)),
    DCase("maxpool-stride-4097", "aten.max_pool2d_with_indices.default", ((1, 1, 1, W + 1),),
          lambda m, x: F.max_pool2d(x, 1, (1, W))),
    DCase("maxpool-ceil-mode", "aten.max_pool2d_with_indices.default", ((1, 4, 5, 5),),
          lambda m, x: F.max_pool2d(x, 2, ceil_mode=True)),
    DCase("maxpool-dilation-2", "aten.max_pool2d_with_indices.default", IMG,
          lambda m, x: F.max_pool2d(x, 2, 2, 0, 2)),
    DCase("avgpool-2", "aten.avg_pool2d.default", IMG, lambda m, x: F.avg_pool2d(x, 2)),
    DCase("avgpool-pad-counted", "aten.avg_pool2d.default", IMG, lambda m, x: F.avg_pool2d(x, 3, 1, 1)),
    DCase("avgpool-pad-excluded", "aten.avg_pool2d.default", IMG,
          lambda m, x: F.avg_pool2d(x, 3, 1, 1, count_include_pad=False)),
    DCase("avgpool-ceil-partial", "aten.avg_pool2d.default", ((1, 4, 5, 5),), lambda m, x: F.avg_pool2d(x, 2, ceil_mode=True)),
    DCase("adaptive-avgpool-2x2", "aten._adaptive_avg_pool2d.default", IMG, lambda m, x: F.adaptive_avg_pool2d(x, 2)),
    DCase("adaptive-avgpool-not-dividing", "aten._adaptive_avg_pool2d.default", ((1, 4, 5, 5),),
          lambda m, x: F.adaptive_avg_pool2d(x, 2)),
    # -- reductions -------------------------------------------------------------------------
    DCase("mean-hw-keepdim", "aten.mean.dim", IMG, lambda m, x: x.mean((2, 3), keepdim=True)),
    DCase("mean-channels", "aten.mean.dim", IMG, lambda m, x: x.mean(1, keepdim=True)),
    DCase("mean-last-no-keepdim", "aten.mean.dim", ((1, 4, 6),), lambda m, x: x.mean(-1)),
    DCase("mean-chw", "aten.mean.dim", IMG, lambda m, x: x.mean((1, 2, 3), keepdim=True)),
    DCase("amax-channels", "aten.amax.default", IMG, lambda m, x: x.amax(1, keepdim=True)),
    # -- softmax ----------------------------------------------------------------------------
    DCase("softmax-last", "aten._softmax.default", ((1, 4, 16),), lambda m, x: x.softmax(-1)),
    DCase("softmax-channels-4d", "aten._softmax.default", IMG, lambda m, x: x.softmax(1)),
    DCase("softmax-2041", "aten._softmax.default", ((1, 2041),), lambda m, x: x.softmax(-1)),
    # -- resize -----------------------------------------------------------------------------
    DCase("nearest-x2", "aten.upsample_nearest2d.vec", IMG, lambda m, x: F.interpolate(x, scale_factor=2)),
    DCase("nearest-x3", "aten.upsample_nearest2d.vec", IMG, lambda m, x: F.interpolate(x, scale_factor=3)),
    DCase("bilinear-x2", "aten.upsample_bilinear2d.vec", IMG,
          lambda m, x: F.interpolate(x, scale_factor=2, mode="bilinear")),
    DCase("bilinear-align-4-to-7", "aten.upsample_bilinear2d.vec", ((1, 4, 4, 4),),
          lambda m, x: F.interpolate(x, size=(7, 7), mode="bilinear", align_corners=True)),
    # -- matrix products --------------------------------------------------------------------
    DCase("linear", "aten.addmm.default", ((2, 8),), _run, _m(m=lambda: torch.nn.Linear(8, 4)),
          also=("aten.linear.default",)),
    DCase("mm-runtime-rhs", "aten.mm.default", ((3, 4), (4, 5)), lambda m, x, y: x @ y),
    DCase("bmm-zero-centred", "aten.bmm.default", ((2, 3, 4), (2, 4, 5)), lambda m, x, y: torch.bmm(x, y)),
    DCase("bmm-positive", "aten.bmm.default", ((2, 3, 4), (2, 4, 5)), lambda m, x, y: torch.bmm(x, y), positive=True),
    # -- concatenation ----------------------------------------------------------------------
    DCase("cat-channels-6", "aten.cat.default", ((1, 2, 3, 3),) * 6, lambda m, *xs: torch.cat(xs, 1)),
    DCase("cat-channels-2", "aten.cat.default", ((1, 4, 3, 3), (1, 2, 3, 3)), lambda m, x, y: torch.cat([x, y], 1)),
    DCase("cat-last-3", "aten.cat.default", ((1, 4, 3), (1, 4, 2), (1, 4, 5)),
          lambda m, x, y, z: torch.cat([x, y, z], -1)),
    # -- padding ----------------------------------------------------------------------------
    DCase("pad-constant", "aten.constant_pad_nd.default", IMG, lambda m, x: F.pad(x, (1, 1, 2, 0)),
          also=("aten.pad.default",)),
    DCase("pad-constant-negative", "aten.constant_pad_nd.default", IMG, lambda m, x: F.pad(x, (-1, 1, 0, 0)),
          also=("aten.pad.default",)),
    DCase("pad-reflect", "aten.pad.default", IMG, lambda m, x: F.pad(x, (1, 2, 2, 1), mode="reflect")),
    # -- activations ------------------------------------------------------------------------
    DCase("relu", "aten.relu.default", IMG, lambda m, x: torch.relu(x)),
    DCase("clamp-0-1", "aten.clamp.default", IMG, lambda m, x: torch.clamp(x, 0.0, 1.0)),
    DCase("relu6", "aten.hardtanh.default", IMG, lambda m, x: F.relu6(x)),
    DCase("hardtanh-0-6", "aten.hardtanh.default", IMG, lambda m, x: F.hardtanh(x, 0.0, 6.0)),
    DCase("hardtanh-half", "aten.hardtanh.default", IMG, lambda m, x: F.hardtanh(x, -0.5, 0.5)),
    DCase("clamp-min-only", "aten.clamp.default", IMG, lambda m, x: torch.clamp(x, min=-0.5)),
    DCase("sigmoid", "aten.sigmoid.default", IMG, lambda m, x: torch.sigmoid(x)),
    DCase("tanh", "aten.tanh.default", IMG, lambda m, x: torch.tanh(x)),
    DCase("leaky-relu", "aten.leaky_relu.default", IMG, lambda m, x: F.leaky_relu(x, 0.1)),
    DCase("hardswish", "aten.hardswish.default", IMG, lambda m, x: F.hardswish(x),
          also=("aten.add.Tensor", "aten.hardtanh.default", "aten.mul.Tensor")),  # etforge: x*relu6(x+3)/6
    # -- elementwise ------------------------------------------------------------------------
    DCase("add-scalar", "aten.add.Tensor", IMG, lambda m, x: x + 0.5),
    DCase("mul-scalar", "aten.mul.Tensor", IMG, lambda m, x: x * 2),
    DCase("add-same-shape", "aten.add.Tensor", ((1, 4, 4), (1, 4, 4)), lambda m, x, y: x + y),
    DCase("add-one-full-operand", "aten.add.Tensor", ((1, 4, 4), (1, 1, 4)), lambda m, x, y: x + y),
    DCase("add-both-broadcast", "aten.add.Tensor", ((1, 4, 1), (1, 1, 4)), lambda m, x, y: x + y),
    DCase("mul-one-full-operand", "aten.mul.Tensor", ((1, 4, 4), (1, 4, 1)), lambda m, x, y: x * y),
    DCase("mul-both-broadcast", "aten.mul.Tensor", ((1, 4, 1), (1, 1, 4)), lambda m, x, y: x * y),
    # -- data movement ----------------------------------------------------------------------
    DCase("permute-nhwc", "aten.permute_copy.default", IMG, lambda m, x: x.permute(0, 2, 3, 1)),
    DCase("permute-rank-5", "aten.permute_copy.default", ((1, 2, 3, 4, 5),), lambda m, x: x.permute(0, 4, 2, 3, 1)),
    DCase("view-rank-8", "aten.view_copy.default", ((2, 128),), lambda m, x: x.view(2, 2, 2, 2, 2, 2, 2, 2) * 2),
    DCase("flatten-4d", "aten.view_copy.default", IMG, lambda m, x: (x * 2).flatten(1) * 3),
    DCase("slice-step-1", "aten.slice_copy.Tensor", ((1, 8, 4),), lambda m, x: x[:, 1:7]),
    DCase("slice-step-2", "aten.slice_copy.Tensor", ((1, 8, 4),), lambda m, x: x[:, 1:7:2]),
]  # fmt: skip
