"""2-D pooling: max_pool2d, avg_pool2d, adaptive_avg_pool2d (NHWC, padding made explicit)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from etforge.sdk import EVERY_NPU, Constraint, OpConverter, QuantRule, hookimpl

if TYPE_CHECKING:
    from torch.fx import Node

    from etforge.sdk import ConversionContext, TargetSpec, Value

NHWC = (0, 2, 3, 1)

#: The NPU names (``NpuSpec.declares``) this module's support checks read.
READS = ("max_kernel", "max_stride", "max_max_pool_stride", "shared_qparams_pool", "avg_pool_counts_padding")


def _window(node: Node) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], bool]:
    from etforge.sdk import arg, pair

    kernel = pair(arg(node, 1, "kernel_size"))
    stride_raw = arg(node, 2, "stride", None)
    stride = pair(stride_raw) if stride_raw else kernel
    padding = pair(arg(node, 3, "padding", 0))
    ceil_mode = bool(arg(node, 5 if "max" in str(node.target) else 4, "ceil_mode", False))
    return kernel, stride, padding, ceil_mode


def _pads(
    in_hw: tuple[int, ...],
    out_hw: tuple[int, ...],
    kernel: tuple[int, ...],
    stride: tuple[int, ...],
    padding: tuple[int, ...],
) -> list[tuple[int, int]]:
    """(before, after) per dim so that a VALID window yields PyTorch's output size (ceil_mode too)."""
    pads = []
    for size, out, k, s, p in zip(in_hw, out_hw, kernel, stride, padding, strict=True):
        needed = (out - 1) * s + k
        pads.append((p, max(needed - size - p, 0)))
    return pads


def _pool(
    ctx: ConversionContext,
    builtin: str,
    x: Value,
    out: Value,
    kernel: tuple[int, ...],
    stride: tuple[int, ...],
    mode: str = "VALID",
) -> None:
    from etforge.sdk import options
    from etforge.sdk import padding as pad_enum

    opts = options(
        "Pool2DOptions",
        padding=pad_enum(mode),
        strideH=stride[0],
        strideW=stride[1],
        filterHeight=kernel[0],
        filterWidth=kernel[1],
    )
    ctx.emit(builtin, [x], [out], opts)


def _limits(
    target: TargetSpec, kernel: tuple[int, ...] | None, stride: tuple[int, ...], stride_key: str
) -> bool | str:
    npu = target.npu
    assert npu is not None
    if kernel is not None and "max_kernel" in npu.limits and max(kernel) > npu.limits["max_kernel"]:
        return f"kernel {list(kernel)} > {npu.limits['max_kernel']}"
    if stride_key in npu.limits and max(stride) > npu.limits[stride_key]:
        return f"stride {list(stride)} > {npu.limits[stride_key]}"
    return True


def _shared_qparams(node: Node, target: TargetSpec) -> bool | str:
    """Input and output quantized alike, when the NPU requires it of pooling (LiteRT does too)."""
    from etforge.sdk import shares_qparams

    if target.npu is None or not target.npu.requirement("shared_qparams_pool"):
        return True
    return shares_qparams(node)


def _max_pool_output(node: Node) -> Node:
    return next(iter(node.users)) if "with_indices" in str(node.target) and node.users else node


def _max_pool_shape(node: Node, target: TargetSpec) -> bool | str:
    from etforge.sdk import shape_of

    if "with_indices" in str(node.target):
        users = list(node.users)
        if not users:
            return "no output used"
        if any(u.args[1] != 0 for u in users):
            return "pooling indices are used"
    ranks = (len(shape_of(node.args[0])), len(shape_of(_max_pool_output(node))))
    return ranks == (4, 4) or f"ranks {list(ranks)}"


def _max_pool_window(node: Node, target: TargetSpec) -> bool | str:
    from etforge.sdk import arg, pair

    if any(d != 1 for d in pair(arg(node, 4, "dilation", 1))):
        return "dilated"
    _, stride, _, _ = _window(node)
    # Padding and ceil_mode become a PADV2 ahead of a VALID window, so only the stride limit
    # of an unpadded window applies (as upstream reasons for its own explicit padding).
    return _limits(target, None, stride, "max_max_pool_stride")


def _avg_pool_window(node: Node, target: TargetSpec) -> bool | str:
    from etforge.sdk import arg, choose_padding, shape_of

    if arg(node, 6, "divisor_override") is not None:
        return "divisor_override"
    if len(shape_of(node.args[0])) != 4:
        return "non-4-D input"
    kernel, stride, padding, _ = _window(node)
    x_hw, out_hw = shape_of(node.args[0])[2:], shape_of(node)[2:]
    pads = _pads(x_hw, out_hw, kernel, stride, padding)
    if any(b != a for a, b in pads):
        return "ceil_mode with a partial last window"
    include = bool(arg(node, 5, "count_include_pad", True))
    if any(padding) and not include:
        npu = target.npu
        if npu is not None and npu.requirement("avg_pool_counts_padding"):
            return "count_include_pad=False with padding"
        if choose_padding(x_hw, kernel, stride, (1, 1), padding) != "SAME":
            return "count_include_pad=False with padding LiteRT SAME does not match"
    return _limits(target, kernel, stride, "max_stride")


def _adaptive_window(node: Node, target: TargetSpec) -> bool | str:
    from etforge.sdk import shape_of

    ins, outs = shape_of(node.args[0]), shape_of(node)
    if len(ins) != 4:
        return "non-4-D input"
    if any(i % o for i, o in zip(ins[2:], outs[2:], strict=True)):
        return f"output size {list(outs[2:])} does not divide input {list(ins[2:])}"
    stride = tuple(i // o for i, o in zip(ins[2:], outs[2:], strict=True))
    kernel = tuple(i - (o - 1) * s for i, o, s in zip(ins[2:], outs[2:], stride, strict=True))
    return _limits(target, kernel, stride, "max_stride")


class MaxPool2d(OpConverter):
    """MAX_POOL_2D; padding (and ceil_mode) become a PADV2 with the lowest value."""

    targets = EVERY_NPU
    reads = READS

    ops = ("aten.max_pool2d_with_indices.default", "aten.max_pool2d.default")
    constraints = (
        Constraint("4-D input and output, indices unused", _max_pool_shape),
        Constraint("dilation 1, stride <= npu max_max_pool_stride", _max_pool_window),
        Constraint("input and output share qparams (npu shared_qparams_pool)", _shared_qparams),
    )

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        from etforge.sdk import shape_of

        out_node = next(iter(node.users)) if "with_indices" in str(node.target) else node
        kernel, stride, padding, _ = _window(node)
        x = ctx.input(node.args[0], NHWC)
        out_shape = shape_of(out_node)
        pads = _pads(x.shape[2:], out_shape[2:], kernel, stride, padding)
        if any(a or b for a, b in pads):
            x = _pad(ctx, x, pads, float("-inf"))
        y = ctx.output(out_node, NHWC)
        if out_node is not node:
            ctx.values[node] = y
        _pool(ctx, "MAX_POOL_2D", x, y, kernel, stride)


def _pad(ctx: ConversionContext, x: Value, pads: list[tuple[int, int]], value: float | None) -> Value:
    from etforge.sdk import pad_spatial

    return pad_spatial(ctx, x, pads, value)


class AvgPool2d(OpConverter):
    """AVERAGE_POOL_2D: VALID, SAME when it equals count_include_pad=False, or PAD + VALID."""

    targets = EVERY_NPU
    reads = READS

    ops = ("aten.avg_pool2d.default",)
    constraints = (
        Constraint(
            "4-D, no divisor_override, ceil_mode only without partial windows, "
            "count_include_pad=False only without padding (npu avg_pool_counts_padding) or as LiteRT SAME, "
            "kernel / stride <= npu max_kernel / max_stride",
            _avg_pool_window,
        ),
        Constraint("input and output share qparams (npu shared_qparams_pool)", _shared_qparams),
    )

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        from etforge.sdk import arg

        kernel, stride, padding, _ = _window(node)
        x = ctx.input(node.args[0], NHWC)
        mode = "VALID"
        if any(padding):
            if bool(arg(node, 5, "count_include_pad", True)):
                x = _pad(ctx, x, list(padding), None)
            else:
                mode = "SAME"
        _pool(ctx, "AVERAGE_POOL_2D", x, ctx.output(node, NHWC), kernel, stride, mode)


class AdaptiveAvgPool2d(OpConverter):
    """Global pooling -> MEAN over H, W; evenly dividing output sizes -> AVERAGE_POOL_2D."""

    targets = EVERY_NPU
    reads = READS

    ops = ("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default")
    constraints = (
        Constraint(
            "4-D, output size divides the input size, equivalent kernel / stride <= npu max_kernel / max_stride",
            _adaptive_window,
        ),
        Constraint("input and output share qparams (npu shared_qparams_pool)", _shared_qparams),
    )

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        import numpy as np

        from etforge.sdk import options, shape_of

        x = ctx.input(node.args[0], NHWC)
        outs = shape_of(node)
        y = ctx.output(node, NHWC)
        if outs[2:] == (1, 1):
            axes = ctx.add_constant(np.asarray([1, 2], np.int32), "int32", "axes")
            ctx.emit("MEAN", [x, axes], [y], options("ReducerOptions", keepDims=True))
            return
        kernel = tuple(i // o for i, o in zip(x.shape[2:], outs[2:], strict=True))
        _pool(ctx, "AVERAGE_POOL_2D", x, y, kernel, kernel)


@hookimpl
def etforge_op_converters() -> list[OpConverter]:
    return [MaxPool2d(), AvgPool2d(), AdaptiveAvgPool2d()]


@hookimpl
def etforge_quantizer_rules() -> list[QuantRule]:
    # LiteRT's int8 pooling kernels do not rescale: output shares the input's qparams.
    return [
        QuantRule(
            ops=(
                "aten.max_pool2d.default",
                "aten.avg_pool2d.default",
                "aten.adaptive_avg_pool2d.default",
                "aten._adaptive_avg_pool2d.default",
            ),
            kind="shared",
            inputs=(0,),
        ),
    ]
