"""Neutron constraint parity: every condition ExecuTorch's NXP converters check, from the target's data.

Each case is one node just inside or just outside one limit (docs/targets.md, "Neutron
constraint parity", maps each to the upstream condition). The decisions are the production
ones -- the real quantizer and ``pipeline.lower`` up to the partitioner's decisions, on both
lowering paths (early, which compile takes, on the decomposed quantized ATen program; classic,
its fallback, on the Edge program) -- made for all cases at once (one export, one
quantization per path) to keep the suite fast; every "inside"
node that the NPU takes is then converted and run in LiteRT against the PT2E quantized
reference (``check_op``: within 1 output step). Cases named ``*-requant`` stand for graphs
another quantizer produces: their Edge program gets the stated zero point / scale on the
node's Q/DQ, so the decision is made on exactly such a node.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from torch.fx import Node

from etforge.core.graph.utils import is_dequantize, is_quantize, node_op
from etforge.core.lower.partitioner import Decision

TARGET = "imxrt700"
ACCEPTED = "accepted"


@dataclass
class Case:
    """A node at one side of one limit: ``fn(mods, *inputs)`` builds it from fresh inputs."""

    id: str
    op: str
    shapes: tuple[tuple[int, ...], ...]
    fn: Callable[..., torch.Tensor]
    #: "accepted", or the text the refusal must contain.
    expect: str
    #: For inside cases refused by *another* limit: text the reason must NOT contain.
    not_because: str = ""
    mods: dict[str, torch.nn.Module] = field(default_factory=dict)
    #: Applied to the node under test on the Edge program before deciding.
    mutate: Callable[[Node], None] | None = None
    positive: bool = False  # inputs in [0, 1) (e.g. for a zero point of -128)

    @property
    def inside(self) -> bool:
        return self.expect == ACCEPTED or bool(self.not_because)


def _conv(c_in: int, c_out: int, k: tuple[int, int], **kw: Any) -> dict[str, torch.nn.Module]:
    return {"m": torch.nn.Conv2d(c_in, c_out, k, **kw)}


def _tconv(k: int, **kw: Any) -> dict[str, torch.nn.Module]:
    return {"m": torch.nn.ConvTranspose2d(2, 2, k, **kw)}


def _mod(mods: dict[str, torch.nn.Module], x: torch.Tensor) -> torch.Tensor:
    return mods["m"](x)


def _requant_output(scale_factor: float) -> Callable[[Node], None]:
    """The node's output quantized at another scale than its input (as another quantizer may)."""

    def mutate(node: Node) -> None:
        users = list(node.users)
        if len(users) == 1 and node_op(users[0]) == "operator.getitem":
            users = list(users[0].users)
        for q in users:
            if is_quantize(q):
                q.args = (q.args[0], float(q.args[1]) * scale_factor, *q.args[2:])
                for dq in list(q.users):
                    if is_dequantize(dq):
                        dq.args = (dq.args[0], float(dq.args[1]) * scale_factor, *dq.args[2:])

    return mutate


def _zero_points(*zps: int) -> Callable[[Node], None]:
    """The node's inputs dequantized with these zero points (the issue's bmm: 23 and -128)."""

    def mutate(node: Node) -> None:
        for arg, zp in zip(node.args, zps, strict=False):
            while isinstance(arg, Node) and not is_dequantize(arg):
                arg = arg.args[0]
            assert isinstance(arg, Node)
            arg.args = (arg.args[0], arg.args[1], zp, *arg.args[3:])

    return mutate


def _set_arg(index: int, value: object) -> Callable[[Node], None]:
    """Argument ``index`` of the node replaced (a form PyTorch's frontend never builds)."""

    def mutate(node: Node) -> None:
        args = list(node.args)
        args[index] = value
        node.args = tuple(args)

    return mutate


def _list_scale(node: Node) -> None:
    """The node's input dequantized with a list of scales instead of one (not per-tensor)."""
    dq = node.args[0]
    assert isinstance(dq, Node) and is_dequantize(dq)
    dq.args = (dq.args[0], [float(dq.args[1])], *dq.args[2:])


BIG = 4096  # the Neutron kernel / stride / dilation limit (upstream convolution_converter.py)
CONV = "aten.convolution.default"
W_LIMIT = "kernel_h * kernel_w * ceil(C_in, num_macs)"

CASES: list[Case] = [
    # -- convolution ------------------------------------------------------------------------
    Case("conv-kernel-4096", CONV, ((1, 1, 1, BIG),), _mod, W_LIMIT, "kernel <=", _conv(1, 1, (1, BIG))),
    Case("conv-kernel-4097", CONV, ((1, 1, 1, BIG + 1),), _mod, "kernel [1, 4097] > 4096", mods=_conv(1, 1, (1, BIG + 1))),
    Case("conv-stride-4096", CONV, ((1, 2, 1, BIG + 1),), _mod, ACCEPTED, mods=_conv(2, 2, (1, 1), stride=(1, BIG))),
    Case("conv-stride-4097", CONV, ((1, 2, 1, BIG + 2),), _mod, "stride [1, 4097] > 4096", mods=_conv(2, 2, (1, 1), stride=(1, BIG + 1))),
    Case("conv-dilation-4096", CONV, ((1, 2, 1, BIG + 1),), _mod, ACCEPTED, mods=_conv(2, 2, (1, 2), dilation=(1, BIG))),
    Case("conv-dilation-4097", CONV, ((1, 2, 1, BIG + 2),), _mod, "dilation [1, 4097] > 4096", mods=_conv(2, 2, (1, 2), dilation=(1, BIG + 1))),
    # 3*3*ceil(7280, 16) = 65520 <= 65535; 3*3*ceil(7281, 16) = 65664
    Case("conv-weight-rows-65520", CONV, ((1, 7280, 3, 3),), _mod, ACCEPTED, mods=_conv(7280, 1, (3, 3))),
    Case("conv-weight-rows-65664", CONV, ((1, 7281, 3, 3),), _mod, "65664 > 65535 with num_macs=16", mods=_conv(7281, 1, (3, 3))),
    Case("conv-depthwise", CONV, ((1, 4, 5, 5),), _mod, ACCEPTED, mods=_conv(4, 4, (3, 3), groups=4)),
    Case("conv-grouped-2", CONV, ((1, 4, 5, 5),), _mod, "groups=2 with C_in=4, C_out=4", mods=_conv(4, 4, (3, 3), groups=2)),
    Case("conv-depth-multiplier-2", CONV, ((1, 4, 5, 5),), _mod, "groups=4 with C_in=4, C_out=8", mods=_conv(4, 8, (3, 3), groups=4)),
    Case("conv-runtime-weight", CONV, ((1, 2, 4, 4), (2, 2, 3, 3)), lambda m, x, w: F.conv2d(x, w), "constant weights and bias"),
    Case("conv-output-padding", CONV, ((1, 2, 4, 4),), _mod, "regular: no output_padding: output_padding [1, 1]",
         mods=_conv(2, 2, (3, 3)), mutate=_set_arg(7, [1, 1])),
    Case("tconv-kernel-4096", CONV, ((1, 1, 1, 1),), _mod, W_LIMIT, "kernel <=", {"m": torch.nn.ConvTranspose2d(1, 1, (1, BIG))}),
    Case("tconv-kernel-4097", CONV, ((1, 1, 1, 1),), _mod, "kernel [1, 4097] > 4096", mods={"m": torch.nn.ConvTranspose2d(1, 1, (1, BIG + 1))}),
    Case("tconv-weight-rows-65520", CONV, ((1, 7280, 1, 1),), _mod, ACCEPTED, mods={"m": torch.nn.ConvTranspose2d(7280, 1, 3)}),
    Case("tconv-weight-rows-65664", CONV, ((1, 7281, 1, 1),), _mod, "65664 > 65535", mods={"m": torch.nn.ConvTranspose2d(7281, 1, 3)}),
    Case("tconv-stride-2", CONV, ((1, 2, 4, 4),), _mod, ACCEPTED, mods=_tconv(3, stride=2)),
    Case("tconv-stride-3", CONV, ((1, 2, 4, 4),), _mod, "stride [3, 3] > 2", mods=_tconv(3, stride=3)),
    Case("tconv-stride-eq-kernel", CONV, ((1, 2, 4, 4),), _mod, ACCEPTED, mods=_tconv(2, stride=2)),
    Case("tconv-stride-gt-kernel", CONV, ((1, 2, 4, 4),), _mod, "stride [2, 2] > kernel [1, 1]", mods=_tconv(1, stride=2)),
    Case("tconv-padding-lt-kernel", CONV, ((1, 2, 4, 4),), _mod, ACCEPTED, mods=_tconv(3, stride=2, padding=2)),
    Case("tconv-padding-eq-kernel", CONV, ((1, 2, 6, 6),), _mod, "padding [3, 3] >= kernel [3, 3]", mods=_tconv(3, padding=3)),
    # (the quantizer keeps a grouped transposed conv float, tests/test_grouped_tconv.py: the int8 gate refuses it first)
    Case("tconv-groups-2", CONV, ((1, 2, 4, 4),), _mod, "float32", mods={"m": torch.nn.ConvTranspose2d(2, 2, 3, groups=2)}),
    Case("tconv-dilation-2", CONV, ((1, 2, 4, 4),), _mod, "dilation [2, 2]", mods=_tconv(3, dilation=2)),
    # -- matrix products --------------------------------------------------------------------
    Case("addmm-bias-row", "aten.addmm.default", ((3, 4),), lambda m, x: torch.addmm(m["b"].bias, x, m["b"].w), ACCEPTED,
         mods={"b": torch.nn.ParameterDict({"bias": torch.nn.Parameter(torch.randn(5)), "w": torch.nn.Parameter(torch.randn(4, 5))})}),
    Case("addmm-bias-matrix", "aten.addmm.default", ((3, 4),), lambda m, x: torch.addmm(m["b"].bias, x, m["b"].w), "bias shape [3, 5]",
         mods={"b": torch.nn.ParameterDict({"bias": torch.nn.Parameter(torch.randn(3, 5)), "w": torch.nn.Parameter(torch.randn(4, 5))})}),
    Case("addmm-beta-2", "aten.addmm.default", ((3, 4),), lambda m, x: torch.addmm(m["b"].bias, x, m["b"].w, beta=2.0), "beta=2",
         mods={"b": torch.nn.ParameterDict({"bias": torch.nn.Parameter(torch.randn(5)), "w": torch.nn.Parameter(torch.randn(4, 5))})}),
    Case("addmm-runtime-matrix", "aten.addmm.default", ((3, 4), (4, 5)), lambda m, x, y: torch.addmm(m["b"].bias, x, y),
         "constant matrix and bias", mods={"b": torch.nn.ParameterDict({"bias": torch.nn.Parameter(torch.randn(5))})}),
    Case("mm-constant-rhs", "aten.mm.default", ((3, 4),), lambda m, x: torch.mm(x, m["b"].w), ACCEPTED,
         mods={"b": torch.nn.ParameterDict({"w": torch.nn.Parameter(torch.randn(4, 5))})}),
    Case("mm-runtime-rhs", "aten.mm.default", ((3, 4), (4, 5)), lambda m, x, y: torch.mm(x, y), "constant right operand"),
    Case("bmm-zero-points-0", "aten.bmm.default", ((2, 3, 4), (2, 4, 5)), lambda m, x, y: torch.bmm(x, y), ACCEPTED),
    Case("bmm-zero-points-23-128", "aten.bmm.default", ((2, 3, 4), (2, 4, 5)), lambda m, x, y: torch.bmm(x, y),
         "input zero points [23, -128]", mutate=_zero_points(23, -128)),
    Case("bmm-zero-points-0-1", "aten.bmm.default", ((2, 3, 4), (2, 4, 5)), lambda m, x, y: torch.bmm(x, y),
         "input zero points [0, 1]", mutate=_zero_points(0, 1)),
    # -- pooling ----------------------------------------------------------------------------
    Case("maxpool-stride-4096", "aten.max_pool2d_with_indices.default", ((1, 1, 1, BIG + 1),),
         lambda m, x: F.max_pool2d(x, (1, 1), (1, BIG)), ACCEPTED),
    Case("maxpool-stride-4097", "aten.max_pool2d_with_indices.default", ((1, 1, 1, BIG + 2),),
         lambda m, x: F.max_pool2d(x, (1, 1), (1, BIG + 1)), "stride [1, 4097] > 4096"),
    Case("maxpool-dilation-2", "aten.max_pool2d_with_indices.default", ((1, 2, 6, 6),),
         lambda m, x: F.max_pool2d(x, 2, dilation=2), "dilated"),
    Case("maxpool-ceil-mode", "aten.max_pool2d_with_indices.default", ((1, 2, 5, 5),),
         lambda m, x: F.max_pool2d(x, 2, ceil_mode=True), ACCEPTED),
    Case("maxpool-requant", "aten.max_pool2d_with_indices.default", ((1, 2, 4, 4),),
         lambda m, x: F.max_pool2d(x, 2), "share qparams", mutate=_requant_output(2.0)),
    Case("avgpool-kernel-4096", "aten.avg_pool2d.default", ((1, 1, 1, BIG),), lambda m, x: F.avg_pool2d(x, (1, BIG)), ACCEPTED),
    Case("avgpool-kernel-4097", "aten.avg_pool2d.default", ((1, 1, 1, BIG + 1),), lambda m, x: F.avg_pool2d(x, (1, BIG + 1)),
         "kernel [1, 4097] > 4096"),
    Case("avgpool-stride-4096", "aten.avg_pool2d.default", ((1, 1, 1, BIG + 1),), lambda m, x: F.avg_pool2d(x, 1, (1, BIG)), ACCEPTED),
    Case("avgpool-stride-4097", "aten.avg_pool2d.default", ((1, 1, 1, BIG + 2),), lambda m, x: F.avg_pool2d(x, 1, (1, BIG + 1)),
         "stride [1, 4097] > 4096"),
    Case("avgpool-pad-counted", "aten.avg_pool2d.default", ((1, 2, 4, 4),),
         lambda m, x: F.avg_pool2d(x, 3, 1, 1, count_include_pad=True), ACCEPTED),
    Case("avgpool-pad-excluded", "aten.avg_pool2d.default", ((1, 2, 4, 4),),
         lambda m, x: F.avg_pool2d(x, 3, 1, 1, count_include_pad=False), "count_include_pad=False with padding"),
    Case("avgpool-divisor-override", "aten.avg_pool2d.default", ((1, 2, 4, 4),),
         lambda m, x: F.avg_pool2d(x, 2, divisor_override=3), "divisor_override"),
    Case("avgpool-ceil-exact", "aten.avg_pool2d.default", ((1, 2, 4, 4),), lambda m, x: F.avg_pool2d(x, 2, ceil_mode=True), ACCEPTED),
    Case("avgpool-ceil-partial", "aten.avg_pool2d.default", ((1, 2, 5, 5),), lambda m, x: F.avg_pool2d(x, 2, ceil_mode=True),
         "partial last window"),
    Case("avgpool-requant", "aten.avg_pool2d.default", ((1, 2, 4, 4),), lambda m, x: F.avg_pool2d(x, 2), "share qparams",
         mutate=_requant_output(2.0)),
    # (1, 2) outputs: stride = kernel = width / 2 (a (1, 1) output becomes a mean)
    Case("adaptive-kernel-4096", "aten._adaptive_avg_pool2d.default", ((1, 1, 1, 2 * BIG),),
         lambda m, x: F.adaptive_avg_pool2d(x, (1, 2)), ACCEPTED),
    Case("adaptive-kernel-4097", "aten._adaptive_avg_pool2d.default", ((1, 1, 1, 2 * BIG + 2),),
         lambda m, x: F.adaptive_avg_pool2d(x, (1, 2)), "kernel [1, 4097] > 4096"),
    Case("adaptive-not-dividing", "aten._adaptive_avg_pool2d.default", ((1, 2, 5, 5),),
         lambda m, x: F.adaptive_avg_pool2d(x, (2, 2)), "does not divide"),
    Case("adaptive-requant", "aten._adaptive_avg_pool2d.default", ((1, 2, 4, 4),),
         lambda m, x: F.adaptive_avg_pool2d(x, (2, 2)), "share qparams", mutate=_requant_output(2.0)),
    # -- activations ------------------------------------------------------------------------
    Case("clamp-one-bound", "aten.clamp.default", ((1, 8),), lambda m, x: torch.clamp(x, min=-0.5), ACCEPTED),
    Case("clamp-no-bound", "aten.clamp.default", ((1, 8),), lambda m, x: torch.clamp(x, float("-inf"), float("inf")), "no finite bound"),
    Case("clamp-relu6-requant", "aten.clamp.default", ((1, 8),), lambda m, x: torch.clamp(x, 0.0, 6.0), ACCEPTED,
         mutate=_requant_output(2.0)),
    Case("clamp-range-requant", "aten.clamp.default", ((1, 8),), lambda m, x: torch.clamp(x, -0.5, 0.5), "share qparams",
         mutate=_requant_output(2.0)),
    Case("hardtanh-range", "aten.hardtanh.default", ((1, 8),), lambda m, x: F.hardtanh(x, -0.5, 0.5), ACCEPTED),
    Case("hardtanh-range-requant", "aten.hardtanh.default", ((1, 8),), lambda m, x: F.hardtanh(x, -0.5, 0.5), "share qparams",
         mutate=_requant_output(2.0)),
    # -- elementwise ------------------------------------------------------------------------
    *[
        Case(f"{name}-full-operand", op, ((1, 4, 4), (1, 1, 4)), fn, ACCEPTED)
        for name, op, fn in (
            ("add", "aten.add.Tensor", lambda m, x, y: x + y),
            ("sub", "aten.sub.Tensor", lambda m, x, y: x - y),
            ("mul", "aten.mul.Tensor", lambda m, x, y: x * y),
            ("maximum", "aten.maximum.default", lambda m, x, y: torch.maximum(x, y)),
            ("minimum", "aten.minimum.default", lambda m, x, y: torch.minimum(x, y)),
        )
    ],
    *[
        Case(f"{name}-both-broadcast", op, ((1, 4, 1), (1, 1, 4)), fn, "output has 16 elements, inputs [4, 4]")
        for name, op, fn in (
            ("add", "aten.add.Tensor", lambda m, x, y: x + y),
            ("sub", "aten.sub.Tensor", lambda m, x, y: x - y),
            ("mul", "aten.mul.Tensor", lambda m, x, y: x * y),
            ("maximum", "aten.maximum.default", lambda m, x, y: torch.maximum(x, y)),
            ("minimum", "aten.minimum.default", lambda m, x, y: torch.minimum(x, y)),
        )
    ],
    Case("add-alpha-2", "aten.add.Tensor", ((1, 8), (1, 8)), lambda m, x, y: torch.add(x, y, alpha=2), "alpha=2"),
    Case("neg-per-tensor", "aten.neg.default", ((1, 8),), lambda m, x: -x, ACCEPTED),
    Case("neg-list-scale", "aten.neg.default", ((1, 8),), lambda m, x: -x, "per-channel quantized input", mutate=_list_scale),
    Case("maximum-requant", "aten.maximum.default", ((1, 8), (1, 8)), lambda m, x, y: torch.maximum(x, y), "share qparams",
         mutate=_requant_output(2.0)),
    Case("minimum-requant", "aten.minimum.default", ((1, 8), (1, 8)), lambda m, x, y: torch.minimum(x, y), "share qparams",
         mutate=_requant_output(2.0)),
    # -- reductions -------------------------------------------------------------------------
    Case("mean-shared", "aten.mean.dim", ((1, 4, 6),), lambda m, x: x.mean(-1, keepdim=True), ACCEPTED),
    Case("mean-requant", "aten.mean.dim", ((1, 4, 6),), lambda m, x: x.mean(-1, keepdim=True), "share qparams",
         mutate=_requant_output(2.0)),
    Case("sum-shared", "aten.sum.dim_IntList", ((1, 4, 6),), lambda m, x: x.sum(-1, keepdim=True), ACCEPTED),
    Case("sum-requant", "aten.sum.dim_IntList", ((1, 4, 6),), lambda m, x: x.sum(-1, keepdim=True), "share qparams",
         mutate=_requant_output(2.0)),
    # -- resize -----------------------------------------------------------------------------
    *[
        Case(f"nearest-x{s}", "aten.upsample_nearest2d.vec", ((1, 2, 3, 3),),
             lambda m, x, s=s: F.interpolate(x, scale_factor=s, mode="nearest"), ACCEPTED)
        for s in (2, 4, 8)
    ],
    *[
        Case(f"nearest-x{s}", "aten.upsample_nearest2d.vec", ((1, 2, 3, 3),),
             lambda m, x, s=s: F.interpolate(x, scale_factor=s, mode="nearest"), "not in [1, 2, 4, 8]")
        for s in (3, 16)
    ],
    Case("bilinear-x2", "aten.upsample_bilinear2d.vec", ((1, 2, 3, 3),),
         lambda m, x: F.interpolate(x, scale_factor=2, mode="bilinear"), ACCEPTED),
    Case("bilinear-x3", "aten.upsample_bilinear2d.vec", ((1, 2, 3, 3),),
         lambda m, x: F.interpolate(x, scale_factor=3, mode="bilinear"), "scales [3.0, 3.0] not in [1, 2, 4, 8]"),
    Case("bilinear-align-4-to-7", "aten.upsample_bilinear2d.vec", ((1, 2, 4, 4),),
         lambda m, x: F.interpolate(x, size=(7, 7), mode="bilinear", align_corners=True), ACCEPTED),
    Case("bilinear-align-4-to-10", "aten.upsample_bilinear2d.vec", ((1, 2, 4, 4),),
         lambda m, x: F.interpolate(x, size=(10, 10), mode="bilinear", align_corners=True), "scales [3.0, 3.0]"),
    Case("bilinear-align-1-pixel", "aten.upsample_bilinear2d.vec", ((1, 2, 1, 4),),
         lambda m, x: F.interpolate(x, size=(2, 7), mode="bilinear", align_corners=True), "align_corners with a 1x4 input"),
    # -- softmax ----------------------------------------------------------------------------
    Case("softmax-channels-2040", "aten._softmax.default", ((1, 2040),), lambda m, x: x.softmax(-1), ACCEPTED),
    Case("softmax-channels-2041", "aten._softmax.default", ((1, 2041),), lambda m, x: x.softmax(-1), "channels 2041 > 2040"),
    Case("softmax-spatial-4096", "aten._softmax.default", ((2, 2048, 2),), lambda m, x: x.softmax(-1), ACCEPTED),
    Case("softmax-spatial-4097", "aten._softmax.default", ((1, 4097, 2),), lambda m, x: x.softmax(-1), "spatial size 4097 > 4096"),
    Case("softmax-elements-524280", "aten._softmax.default", ((257, 2040),), lambda m, x: x.softmax(-1), ACCEPTED),
    Case("softmax-elements-526320", "aten._softmax.default", ((258, 2040),), lambda m, x: x.softmax(-1), "elements 526320 > 524288"),
    # -- data movement ----------------------------------------------------------------------
    Case("view-rank-7", "aten.view_copy.default", ((2, 64),), lambda m, x: x.view(2, 2, 2, 2, 2, 2, 2), ACCEPTED),
    Case("view-rank-8", "aten.view_copy.default", ((2, 128),), lambda m, x: x.view(2, 2, 2, 2, 2, 2, 2, 2), "rank 8 > 7"),
    Case("cat-shared", "aten.cat.default", ((1, 4), (1, 4)), lambda m, x, y: torch.cat([x, y], 1), ACCEPTED),
    Case("cat-requant", "aten.cat.default", ((1, 4), (1, 4)), lambda m, x, y: torch.cat([x, y], 1), "share qparams",
         mutate=_requant_output(2.0)),
    Case("permute-shared", "aten.permute_copy.default", ((1, 2, 3),), lambda m, x: x.permute(0, 2, 1), ACCEPTED),
    Case("permute-requant", "aten.permute_copy.default", ((1, 2, 3),), lambda m, x: x.permute(0, 2, 1), "share qparams",
         mutate=_requant_output(2.0)),
    Case("slice-step-1", "aten.slice_copy.Tensor", ((1, 8),), lambda m, x: x[:, 1:7], ACCEPTED),
    Case("slice-step-2", "aten.slice_copy.Tensor", ((1, 8),), lambda m, x: x[:, 1:7:2], "step 2"),
    Case("slice-empty", "aten.slice_copy.Tensor", ((1, 8),), lambda m, x: x[:, 5:2], "empty slice 5:2"),
    Case("pad-shared", "aten.constant_pad_nd.default", ((1, 2, 3, 3),), lambda m, x: F.pad(x, (1, 1, 1, 1)), ACCEPTED),
    Case("pad-requant", "aten.constant_pad_nd.default", ((1, 2, 3, 3),), lambda m, x: F.pad(x, (1, 1, 1, 1)), "share qparams",
         mutate=_requant_output(2.0)),
]  # fmt: skip


class Cases(torch.nn.Module):
    """Every case as an independent branch on its own inputs."""

    def __init__(self, cases: list[Case]) -> None:
        super().__init__()
        self.cases = cases
        self.mods = torch.nn.ModuleList(torch.nn.ModuleDict(c.mods) for c in cases)

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        outs, i = [], 0
        for case, mods in zip(self.cases, self.mods, strict=True):
            n = len(case.shapes)
            outs.append(case.fn(mods, *xs[i : i + n]))
            i += n
        return tuple(outs)


def _inputs(cases: list[Case], seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for c in cases:
        for s in c.shapes:
            out.append(torch.rand(s, generator=g) if c.positive else torch.randn(s, generator=g))
    return tuple(out)


#: Edge ops whose node on the early path's quantized ATen program (decomposed, not yet
#: ``to_edge``'s dim-order form) is another op.
ATEN_FORMS: dict[str, str] = {"dim_order_ops._clone_dim_order.default": "aten.clone.default"}


def _node_of(ep: Any, cases: list[Case]) -> dict[str, Node]:
    """The node under test of each case: the first node of its op (Edge op, or its ATen form on
    the early path) downstream of its first input."""
    placeholders = {n.name: n for n in ep.graph_module.graph.nodes if n.op == "placeholder"}
    user_inputs = [placeholders[name] for name in ep.graph_signature.user_inputs]
    found, i = {}, 0
    for c in cases:
        frontier, seen = [user_inputs[i]], set()
        while frontier:
            n = frontier.pop(0)
            if n in seen:
                continue
            seen.add(n)
            if n.op == "call_function" and node_op(n) in (c.op, ATEN_FORMS.get(c.op)):
                found[c.id] = n
                break
            frontier.extend(n.users)
        i += len(c.shapes)
    return found


#: The two lowering paths (``pipeline.lower``): early, what compile takes on a quantized
#: program, and classic, its fallback and reference. Each decides on its own graph (the early
#: path on the decomposed quantized ATen program, the classic one on ``to_edge``'s output).
PATHS = ("early", "classic")


class _Decided(Exception):
    """Raised by the partitioner hook once it has decided: the lowering stops there (the
    mutated graphs stand for other quantizers' programs and are not meant to run on)."""


def decide(
    cases: list[Case],
    path: str = "early",
    target: str = TARGET,
    options: dict[str, object] | None = None,
    quantize: bool = True,
) -> tuple[dict[str, tuple[bool, str]], list[Decision]]:
    """(on the NPU, reason) of each case's node and every decision, made as compile makes them:
    ``pipeline.lower`` on ``path`` up to the partitioner's first ``partition`` (decisions and
    partition-level checks), the cases' mutations applied to the graph it is handed."""
    from unittest import mock

    from etforge.core.build import pipeline
    from etforge.core.common import fallbacks
    from etforge.core.lower.partitioner import _SUPPORT_KEY, EtforgePartitioner
    from etforge.core.registry.manager import registry

    torch.manual_seed(0)
    reg = registry()
    tgt = reg.target(target)
    ep = pipeline.export(Cases(cases).eval(), _inputs(cases, 0))
    if quantize:
        ep = pipeline.quantize(ep, tgt, [_inputs(cases, s) for s in range(3)], reg)
    real_partition = EtforgePartitioner.partition
    seen: dict[str, Any] = {}

    def partition(self: EtforgePartitioner, program: Any) -> Any:
        nodes = _node_of(program, cases)
        for c in cases:
            if c.mutate is not None and c.id in nodes:
                c.mutate(nodes[c.id])
                nodes[c.id].meta.pop(_SUPPORT_KEY, None)  # decided again on the mutated node
        real_partition(self, program)
        by_name = {d.node: d for d in self.decisions}
        seen["found"] = {cid: (by_name[n.name].npu, by_name[n.name].reason) for cid, n in nodes.items()}
        seen["decisions"], seen["dialect"] = self.decisions, program.dialect
        raise _Decided

    # strict: the early path falling back to the classic one is an error, not a silent switch
    with mock.patch.object(EtforgePartitioner, "partition", partition), fallbacks.recording(strict=True):
        with pytest.raises(_Decided):
            pipeline.lower(ep, tgt, options, reg, early=path == "early")
    # the early path decides on the quantized ATen program, the classic one on the Edge program
    assert seen["dialect"] == ("EDGE" if path == "classic" or not quantize else "ATEN"), (
        path,
        seen["dialect"],
    )
    return seen["found"], seen["decisions"]


def _decide(cases: list[Case], path: str = "early", quantize: bool = True) -> dict[str, tuple[bool, str]]:
    return decide(cases, path, quantize=quantize)[0]


@pytest.fixture(scope="module", params=PATHS)
def decisions(request: pytest.FixtureRequest) -> dict[str, tuple[bool, str]]:
    return _decide(CASES, request.param)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_condition(case: Case, decisions: dict[str, tuple[bool, str]]) -> None:
    assert case.id in decisions, f"no {case.op} node found for {case.id}"
    npu, reason = decisions[case.id]
    if case.expect == ACCEPTED:
        assert npu, f"{case.id} refused: {reason}"
    else:
        assert not npu and case.expect in reason, f"{case.id}: npu={npu}, reason {reason!r}"
    if case.not_because:
        assert case.not_because not in reason


def test_inside_cases_run_in_litert_within_one_step() -> None:
    """Every accepted inside case converts and runs in LiteRT, 1 step from the PT2E reference."""
    from etforge.testing import check_op

    inside = [c for c in CASES if c.expect == ACCEPTED and c.mutate is None]
    check_op(Cases(inside), _inputs(inside, 0), target=TARGET, max_steps=1.0)


def _case(case_id: str) -> Case:
    return next(c for c in CASES if c.id == case_id)


def test_float_nodes_stay_off_the_int8_npu() -> None:
    """Neutron runs int8 only: an unquantized conv is refused, and says why."""
    npu, reason = _decide([_case("conv-depthwise")], quantize=False)["conv-depthwise"]
    assert not npu and reason == "float32: the neutron-c NPU runs int8 only"


def test_ops_lists_the_dtypes_the_target_runs() -> None:
    from support import run_cli

    rows = json.loads(run_cli("ops", "--target", TARGET, "--json").stdout)
    assert rows and {tuple(r["dtypes"]) for r in rows} == {("int8",)}
    assert any("float32" in r["converter_dtypes"] for r in rows)  # the converters could, the NPU cannot
    litert = json.loads(run_cli("ops", "--target", "litert", "--json").stdout)
    assert any("float32" in r["dtypes"] for r in litert)


def test_targets_mark_num_macs_as_an_assumption() -> None:
    from support import run_cli

    text = run_cli("targets").stdout
    assert "num_macs=16 (assumption)" in text and "num_macs=16 is an assumption" in text
    spec = {t["name"]: t for t in json.loads(run_cli("targets", "--json").stdout)}["imxrt700"]["npu"]
    assert spec["figures"]["num_macs"]["assumption"] is True
    assert spec["figures"]["num_macs"]["source"].startswith("assumption:")


SDK_DOUBLE = __import__("pathlib").Path(__file__).parent / "sdk_double"


def test_num_macs_is_read_from_the_sdk_when_installed() -> None:
    """With the SDK (its test double, reporting 64 MACs) the figure comes from getNeutronTarget."""
    from support import run_cli

    out = run_cli("targets", "--json", pythonpath=SDK_DOUBLE, env={"ETFORGE_SDK_DOUBLE_NUM_MACS": "64"})
    assert out.returncode == 0, out.stderr
    spec = {t["name"]: t for t in json.loads(out.stdout)}["imxrt700"]["npu"]
    assert spec["num_macs"] == 64
    assert spec["figures"]["num_macs"]["assumption"] is False
    assert "vendor SDK" in spec["figures"]["num_macs"]["source"]


def test_sdk_num_macs_drives_the_conv_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    """3*3*ceil(7280, 64) = 65664 > 65535: accepted with the assumed 16 MACs, refused with the SDK's 64."""
    import os

    from etforge.core.contracts import target as target_mod

    monkeypatch.syspath_prepend(str(SDK_DOUBLE))  # find_spec sees the SDK; the child imports it
    monkeypatch.setenv("PYTHONPATH", f"{SDK_DOUBLE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("ETFORGE_SDK_DOUBLE_NUM_MACS", "64")
    monkeypatch.setattr(target_mod, "_PROBED", {})
    npu, reason = _decide([_case("conv-weight-rows-65520")])["conv-weight-rows-65520"]
    assert not npu and "65664 > 65535 with num_macs=64" in reason and "assumption" not in reason


def test_report_marks_assumed_figures() -> None:
    from etforge.core.build.report import build_report
    from etforge.core.build.session import compile_model
    from etforge.core.registry.manager import registry

    torch.manual_seed(0)
    x = (torch.randn(1, 8),)
    result = compile_model(torch.nn.Linear(8, 4), x, TARGET, calibration=[x])
    fig = build_report(result, registry(), "linear")["npu_figures"]["num_macs"]
    assert fig["value"] == 16 and fig["assumption"] is True
