"""Matrix products: linear / addmm / mm with constant weights -> FULLY_CONNECTED; bmm and
runtime-by-runtime mm -> BATCH_MATMUL."""

from __future__ import annotations

from typing import TYPE_CHECKING

from etforge.core.converter import SUPPORTED, OpConverter, Support, unsupported
from etforge.core.hookspecs import hookimpl
from etforge.core.quant_rule import FUSABLE_ACTIVATIONS, QuantRule

if TYPE_CHECKING:
    from torch.fx import Node

    from etforge.core.litert_convert import Constant, ConversionContext
    from etforge.core.target import TargetSpec


def _fully_connected(ctx: ConversionContext, node: Node, x_arg: object, w: Constant, bias: object) -> None:
    """y = x @ w.T + b over the last dim; ``w`` is (out_features, in_features)."""
    from etforge.core.litert import options
    from etforge.core.litert_convert import Constant, activation
    from etforge.core.ophelpers import bias_tensor

    act, out_node = ctx.fuse_activation(node)
    x = ctx.input_columns(x_arg)
    if x.columns is not None:  # a channels-last flatten: reorder the weight's columns instead
        w = Constant(w.data[:, list(x.columns)], w.dtype, w.quant, w.name)
    wt = ctx.constant_tensor(w)
    b = bias_tensor(ctx, bias, w.data.shape[0], x, w.quant, "bias")
    y = ctx.output(out_node)
    opts = options("FullyConnectedOptions", fusedActivationFunction=activation(act), keepNumDims=x.rank > 2)
    ctx.emit("FULLY_CONNECTED", [x, wt, b], [y], opts)


class Linear(OpConverter):
    ops = ("aten.linear.default",)
    preserve = ("aten.linear.default",)
    constraints = ("constant weight and bias", "fuses relu / relu6")

    def check(self, node: Node, target: TargetSpec) -> Support:
        from etforge.core.graph_utils import is_constant

        bias = node.args[2] if len(node.args) > 2 else None
        if not is_constant(node.args[1]) or (bias is not None and not is_constant(bias)):
            return unsupported("weight/bias are not constant")
        return SUPPORTED

    def macs(self, node: Node) -> int:
        from math import prod

        from etforge.core.graph_utils import shape_of

        return prod(shape_of(node)) * shape_of(node.args[1])[1]

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        w = ctx.constant(node.args[1])
        assert w is not None
        _fully_connected(ctx, node, node.args[0], w, node.args[2] if len(node.args) > 2 else None)


class MatMul(OpConverter):
    """addmm / mm: FULLY_CONNECTED when the right operand is constant, else BATCH_MATMUL."""

    ops = ("aten.addmm.default", "aten.mm.default", "aten.bmm.default")
    constraints = ("addmm: beta == alpha == 1 and constant operand", "bmm / mm: BATCH_MATMUL")

    def _operands(self, node: Node) -> tuple[object, object, object]:
        if "addmm" in str(node.target):
            return node.args[1], node.args[2], node.args[0]
        return node.args[0], node.args[1], None

    def check(self, node: Node, target: TargetSpec) -> Support:
        from etforge.core.graph_utils import is_constant

        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            return unsupported("addmm with beta/alpha != 1")
        a, b, bias = self._operands(node)
        if bias is not None and not (is_constant(b) and is_constant(bias)):
            return unsupported("addmm needs a constant matrix and bias")
        if is_constant(a):
            return unsupported("constant left operand")
        return SUPPORTED

    def macs(self, node: Node) -> int:
        from math import prod

        from etforge.core.graph_utils import shape_of

        a, _, _ = self._operands(node)
        return prod(shape_of(node)) * shape_of(a)[-1]

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        from etforge.core import layout
        from etforge.core.litert import options
        from etforge.core.litert_convert import Constant

        a, b, bias = self._operands(node)
        bconst = ctx.constant(b)
        if bconst is not None and bconst.data.ndim == 2:
            q = bconst.quant
            if q is not None and q.per_channel:
                from etforge.core.litert import Quant

                q = Quant(q.scale, q.zero_point, 1 - q.axis)
            w = Constant(bconst.data.T.copy(), bconst.dtype, q, bconst.name)
            _fully_connected(ctx, node, a, w, bias)
            return
        x = ctx.input(a, layout.identity(ctx.value(a).rank))
        y_in = ctx.input(
            b, layout.identity(len(ctx.value(b).shape) if not ctx.is_constant(b) else bconst.data.ndim)
        )
        out = ctx.output(node)
        ctx.emit("BATCH_MATMUL", [x, y_in], [out], options("BatchMatMulOptions", adjX=False, adjY=False))


@hookimpl
def etforge_op_converters() -> list[OpConverter]:
    return [Linear(), MatMul()]


@hookimpl
def etforge_quantizer_rules() -> list[QuantRule]:
    return [
        QuantRule(ops=("aten.linear.default",), kind="weighted", fuse=FUSABLE_ACTIVATIONS),
        QuantRule(ops=("aten.mm.default", "aten.bmm.default", "aten.matmul.default"), kind="io"),
        QuantRule(ops=("aten.addmm.default",), kind="io", inputs=(1, 2)),
    ]
