"""Convolutions: regular, depthwise, grouped, transposed, and 1-D (as 2-D with H = 1)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from etforge.plugins.ops.activation import FUSABLE_ACTIVATIONS
from etforge.sdk import EVERY_NPU, Constraint, OpConverter, QuantRule, hookimpl

if TYPE_CHECKING:
    from torch.fx import Node

    from etforge.sdk import Constant, ConversionContext, TargetSpec, Value

NHWC = (0, 2, 3, 1)

#: The NPU names (``NpuSpec.declares``) this module's support checks read.
READS = (
    "max_kernel",
    "max_stride",
    "max_dilation",
    "max_weight_rows",
    "max_transpose_conv_stride",
    "conv_plain_or_depthwise",
    "max_split_groups",
)


def _params(
    node: Node,
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], bool, tuple[int, ...], int]:
    stride, padding, dilation, transposed, out_pad, groups = node.args[3:9]
    return tuple(stride), tuple(padding), tuple(dilation), bool(transposed), tuple(out_pad), int(groups)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _rank_1d_2d(node: Node, target: TargetSpec) -> bool | str:
    from etforge.sdk import shape_of

    rank = len(shape_of(node.args[0]))
    return rank in (3, 4) or f"{rank - 2}-D"


def _constant_weights(node: Node, target: TargetSpec) -> bool:
    from etforge.sdk import is_constant

    b = node.args[2]
    return is_constant(node.args[1]) and (b is None or is_constant(b))


def _window(node: Node, target: TargetSpec) -> bool | str:
    """Kernel <= max_kernel; regular convs also stride <= max_stride, dilation <= max_dilation."""
    from etforge.sdk import shape_of

    npu = target.npu
    assert npu is not None
    stride, _, dilation, transposed, _, _ = _params(node)
    kernel = shape_of(node.args[1])[2:]
    checks = [("kernel", kernel, "max_kernel")]
    if not transposed:  # a transposed conv's stride has its own, smaller limit
        checks += [("stride", stride, "max_stride"), ("dilation", dilation, "max_dilation")]
    for what, values, key in checks:
        if key in npu.limits and max(values) > npu.limits[key]:
            return f"{what} {list(values)} > {npu.limits[key]}"
    return True


def _weight_rows(node: Node, target: TargetSpec) -> bool | str:
    """kernel_h * kernel_w * ceil(C_in, num_macs) within the NPU's weight-row limit.

    C_in is the input's whole channel count, depthwise included, as upstream counts it.
    """
    from etforge.sdk import shape_of

    npu = target.npu
    assert npu is not None
    if "max_weight_rows" not in npu.limits:
        return True
    macs = int(npu.figure("num_macs"))
    rows = math.prod(shape_of(node.args[1])[2:]) * _round_up(shape_of(node.args[0])[1], macs)
    limit = npu.limits["max_weight_rows"]
    note = " (num_macs is an assumption)" if npu.is_assumption("num_macs") else ""
    return rows <= limit or f"{rows} > {limit} with num_macs={macs}{note}"


def _plain_or_depthwise(node: Node, target: TargetSpec) -> bool | str:
    """Grouped convolutions when the NPU runs regular and depthwise ones only: depthwise
    (C_in == C_out == groups) runs as such; 2..max_split_groups groups are split into
    single-group convs by the grouped_conv rewrite, so one left whole is refused; more groups
    run as one grouped CONV_2D (upstream's choice)."""
    from etforge.sdk import shape_of

    npu = target.npu
    assert npu is not None
    *_, transposed, _, groups = _params(node)
    if groups == 1 or transposed or not npu.requirement("conv_plain_or_depthwise"):
        return True
    c_in, c_out = shape_of(node.args[0])[1], shape_of(node.args[1])[0]
    if c_in == c_out == groups:
        return True
    split = npu.limits.get("max_split_groups", 0)
    if groups > split:
        return True
    return (
        f"groups={groups} with C_in={c_in}, C_out={c_out}: not depthwise, and within "
        f"max_split_groups={split} it runs split into single-group convs (grouped_conv rewrite), not whole"
    )


def _transposed_limits(node: Node, target: TargetSpec) -> bool | str:
    from etforge.sdk import shape_of

    npu = target.npu
    assert npu is not None
    stride, padding, dilation, transposed, out_pad, groups = _params(node)
    if not transposed:
        return True
    kernel = shape_of(node.args[1])[2:]
    if groups != 1:
        return f"groups={groups}"
    if any(d != 1 for d in dilation):
        return f"dilation {list(dilation)}"
    limit = npu.limits.get("max_transpose_conv_stride")
    if limit is not None and max(stride) > limit:
        return f"stride {list(stride)} > {limit}"
    if any(s > k for s, k in zip(stride, kernel, strict=False)):
        return f"stride {list(stride)} > kernel {list(kernel)}"
    if any(p >= k for p, k in zip(padding, kernel, strict=False)):
        return f"padding {list(padding)} >= kernel {list(kernel)}"
    return True


def _no_output_padding(node: Node, target: TargetSpec) -> bool | str:
    *_, transposed, out_pad, _ = _params(node)
    return transposed or all(o == 0 for o in out_pad) or f"output_padding {list(out_pad)}"


class Convolution(OpConverter):
    """CONV_2D / DEPTHWISE_CONV_2D / TRANSPOSE_CONV; weights permuted to OHWI / 1HWO at conversion."""

    targets = EVERY_NPU
    reads = READS

    ops = ("aten.convolution.default",)
    constraints = (
        Constraint("1-D or 2-D", _rank_1d_2d),
        Constraint("constant weights and bias", _constant_weights),
        Constraint("kernel <= npu max_kernel; stride, dilation <= max_stride, max_dilation", _window),
        Constraint("kernel_h * kernel_w * ceil(C_in, num_macs) <= npu max_weight_rows", _weight_rows),
        Constraint(
            "grouped: depthwise, or more than max_split_groups groups (npu conv_plain_or_depthwise)",
            _plain_or_depthwise,
        ),
        Constraint(
            "transposed: groups 1, dilation 1, stride <= max_transpose_conv_stride and <= kernel, "
            "padding < kernel",
            _transposed_limits,
        ),
        Constraint("regular: no output_padding", _no_output_padding),
    )

    def macs(self, node: Node) -> int:
        from etforge.sdk import shape_of

        w = shape_of(node.args[1])
        transposed = bool(node.args[6])
        spatial = math.prod(shape_of(node.args[0])) if transposed else math.prod(shape_of(node))
        return spatial * w[1] * math.prod(w[2:])

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        from etforge.sdk import Constant, Value, shape_of

        stride, padding, dilation, transposed, out_pad, groups = _params(node)
        is_1d = len(shape_of(node.args[0])) == 3
        act, out_node = ctx.fuse_activation(node)
        w = ctx.constant(node.args[1])
        assert w is not None
        if is_1d:
            x3 = ctx.input(node.args[0], (0, 2, 1))  # N, L, C
            n, c, length = x3.shape
            x4 = ctx.temp((n, 1, length, c), x3.dtype, "as2d", x3.quant)
            ctx.reshape(x3, x4, (n, 1, length, c))
            x = Value(x4, (n, c, 1, length), NHWC, x3.dtype, x3.quant)
            w = Constant(w.data[:, :, None, :], w.dtype, w.quant, w.name)
            stride, padding, dilation = (1, *stride), (0, *padding), (1, *dilation)
            o = shape_of(out_node)
            out_shape = (o[0], o[1], 1, o[2])
            y = Value(
                ctx.temp((o[0], 1, o[2], o[1]), x.dtype, "conv2d", ctx.output_quant(out_node)),
                out_shape,
                NHWC,
                x.dtype,
                None,
            )
        else:
            x = ctx.input(node.args[0], NHWC)
            y = ctx.output(out_node, NHWC)
        if transposed:
            _transpose_conv(ctx, x, w, node.args[2], stride, padding, y, act)
        else:
            _conv(ctx, x, w, node.args[2], stride, padding, dilation, groups, y, act)
        if is_1d:
            final = ctx.output(out_node, (0, 2, 1))
            ctx.reshape(y, final, final.stored_shape)


def _conv(
    ctx: ConversionContext,
    x: Value,
    w: Constant,
    bias: object,
    stride: tuple[int, ...],
    padding: tuple[int, ...],
    dilation: tuple[int, ...],
    groups: int,
    y: Value,
    act: str,
) -> None:
    from etforge.sdk import activation, bias_tensor, choose_padding, options, pad_spatial
    from etforge.sdk import padding as pad_enum

    c_out, c_in_g, kh, kw = w.data.shape
    c_in = x.shape[1]
    mode = choose_padding(x.shape[2:], (kh, kw), stride, dilation, padding)
    if mode == "EXPLICIT":
        x, mode = pad_spatial(ctx, x, padding), "VALID"
    b = bias_tensor(ctx, bias, c_out, x, w.quant, "bias")
    common = dict(
        padding=pad_enum(mode),
        strideH=stride[0],
        strideW=stride[1],
        dilationHFactor=dilation[0],
        dilationWFactor=dilation[1],
        fusedActivationFunction=activation(act),
    )
    if groups == c_in and groups > 1 and c_in_g == 1:
        wt = ctx.constant_tensor(w, (1, 2, 3, 0))  # (C_out, 1, kh, kw) -> 1HWO
        ctx.emit(
            "DEPTHWISE_CONV_2D",
            [x, wt, b],
            [y],
            options("DepthwiseConv2DOptions", depthMultiplier=c_out // c_in, **common),
        )
    else:
        wt = ctx.constant_tensor(w, NHWC)  # OIHW -> OHWI (grouped: I = C_in / groups)
        ctx.emit("CONV_2D", [x, wt, b], [y], options("Conv2DOptions", **common))


def _transpose_conv(
    ctx: ConversionContext,
    x: Value,
    w: Constant,
    bias: object,
    stride: tuple[int, ...],
    padding: tuple[int, ...],
    y: Value,
    act: str,
) -> None:
    """TRANSPOSE_CONV with VALID padding, then a SLICE crop for PyTorch's padding.

    ``output_padding`` beyond ``padding`` asks for rows / columns past the last kernel
    position: TRANSPOSE_CONV is given that larger output shape, and the places no kernel
    reaches hold the bias alone, as in PyTorch."""
    import numpy as np

    from etforge.sdk import activation, bias_tensor, options
    from etforge.sdk import padding as pad_enum

    _, c_out, kh, kw = w.data.shape
    n, _, h, wd = x.shape
    out_h, out_w = y.stored_shape[1:3]
    full = (
        n,
        max((h - 1) * stride[0] + kh, padding[0] + out_h),
        max((wd - 1) * stride[1] + kw, padding[1] + out_w),
        c_out,
    )
    wt = ctx.constant_tensor(w, (1, 2, 3, 0))  # (C_in, C_out, kh, kw) -> (C_out, kh, kw, C_in)
    b = bias_tensor(ctx, bias, c_out, x, w.quant, "bias")
    shape_t = ctx.add_constant(np.asarray(full, np.int32), "int32", "output_shape")
    opts = options(
        "TransposeConvOptions",
        padding=pad_enum("VALID"),
        strideH=stride[0],
        strideW=stride[1],
        fusedActivationFunction=activation(act),
    )
    if full == y.stored_shape:
        ctx.emit("TRANSPOSE_CONV", [shape_t, wt, x, b], [y], opts)
        return
    # Activations are elementwise, so fusing them before the crop is exact.
    tmp = ctx.temp(full, y.dtype, "uncropped", ctx.builder.tensor_quant(y.tensor))
    ctx.emit("TRANSPOSE_CONV", [shape_t, wt, x, b], [tmp], opts)
    begin = ctx.add_constant(np.asarray([0, padding[0], padding[1], 0], np.int32), "int32", "begin")
    size = ctx.add_constant(np.asarray(y.stored_shape, np.int32), "int32", "size")
    ctx.emit("SLICE", [tmp, begin, size], [y])


@hookimpl
def etforge_op_converters() -> list[OpConverter]:
    return [Convolution()]


@hookimpl
def etforge_quantizer_rules() -> list[QuantRule]:
    return [
        QuantRule(
            ops=("aten.conv1d.default", "aten.conv2d.default", "aten.convolution.default"),
            kind="weighted",
            fuse=FUSABLE_ACTIVATIONS,
        ),
        QuantRule(
            ops=("aten.conv_transpose1d.default", "aten.conv_transpose2d.input"),
            kind="weighted",
            weight_axis=1,
            fuse=FUSABLE_ACTIVATIONS,
        ),
    ]
