"""Activations: relu, relu6/hardtanh/clamp, leaky_relu, prelu, sigmoid, tanh, hardswish."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from etforge.core.converter import SUPPORTED, OpConverter, Support, unsupported
from etforge.core.hookspecs import hookimpl
from etforge.core.quant_rule import QuantRule

if TYPE_CHECKING:
    from torch.fx import Node

    from etforge.core.litert_convert import ConversionContext
    from etforge.core.target import TargetSpec

#: LiteRT builtins for clamp ranges it has a dedicated op for.
_RANGES = {(0.0, 6.0): "RELU6", (-1.0, 1.0): "RELU_N1_TO_1", (0.0, None): "RELU"}


def _bounds(node: Node) -> tuple[float | None, float | None]:
    from etforge.core.ophelpers import arg

    if "hardtanh" in str(node.target):
        return float(arg(node, 1, "min_val", -1.0)), float(arg(node, 2, "max_val", 1.0))
    lo, hi = arg(node, 1, "min"), arg(node, 2, "max")
    return (None if lo is None else float(lo)), (None if hi is None else float(hi))


class Clamp(OpConverter):
    """hardtanh / clamp: RELU6, RELU_N1_TO_1 or RELU when the range matches, else MAXIMUM/MINIMUM."""

    ops = ("aten.hardtanh.default", "aten.clamp.default")
    constraints = ("scalar bounds",)

    def check(self, node: Node, target: TargetSpec) -> Support:
        from etforge.core.ophelpers import arg

        if any(hasattr(v, "op") for v in (arg(node, 1, "min"), arg(node, 2, "max"))):
            return unsupported("tensor bounds")
        return SUPPORTED

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        import numpy as np

        lo, hi = _bounds(node)
        x = ctx.input(node.args[0])
        builtin = _RANGES.get((lo, hi))
        if builtin is not None:
            ctx.emit(builtin, [x], [ctx.output(node, x.perm)])
            return
        out_q = ctx.output_quant(node)
        cur = x
        for bound, op in ((lo, "MAXIMUM"), (hi, "MINIMUM")):
            if bound is None:
                continue
            q = cur.quant
            if q is None:
                c = ctx.add_constant(np.asarray([bound], np.float32), "float32", f"{op.lower()}_bound")
            else:
                raw = np.clip(np.round(bound / q.scale[0]) + q.zero_point[0], -128, 127)
                c = ctx.add_constant(np.asarray([raw], np.int8), "int8", f"{op.lower()}_bound", quant=q)
            last = (op == "MINIMUM" and hi is not None) or (op == "MAXIMUM" and hi is None)
            if last:
                out = ctx.output(node, x.perm)
                if q is not None and out_q is not None and out_q != q:
                    tmp = ctx.temp(cur.stored_shape, cur.dtype, op.lower(), q)
                    ctx.emit(op, [cur, c], [tmp])
                    ctx.emit("QUANTIZE", [tmp], [out])  # int8 -> int8 requantize
                else:
                    ctx.emit(op, [cur, c], [out])
                return
            from etforge.core.litert_convert import Value

            tmp = ctx.temp(cur.stored_shape, cur.dtype, op.lower(), q)
            ctx.emit(op, [cur, c], [tmp])
            cur = Value(tmp, cur.shape, cur.perm, cur.dtype, q)


class LeakyRelu(OpConverter):
    ops = ("aten.leaky_relu.default",)

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        from etforge.core.litert import options
        from etforge.core.ophelpers import arg

        x = ctx.input(node.args[0])
        alpha = float(arg(node, 1, "negative_slope", 0.01))
        ctx.emit("LEAKY_RELU", [x], [ctx.output(node, x.perm)], options("LeakyReluOptions", alpha=alpha))


class Prelu(OpConverter):
    """PRELU with the slope broadcast over channels (stored in the input's layout)."""

    ops = ("aten._prelu_kernel.default", "aten.prelu.default")
    preserve = ("aten.prelu.default",)
    constraints = ("constant slope",)

    def check(self, node: Node, target: TargetSpec) -> Support:
        from etforge.core.graph_utils import is_constant

        return SUPPORTED if is_constant(node.args[1]) else unsupported("slope is not constant")

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        from etforge.core.litert_convert import Constant

        x = ctx.input(node.args[0])
        slope = ctx.constant(node.args[1])
        assert slope is not None
        rank = x.rank
        shape = [1] * rank
        if slope.data.size > 1:
            shape[1] = slope.data.size
        data = slope.data.reshape(shape)
        quant = slope.quant
        if quant is not None and quant.per_channel:
            from etforge.core.litert import Quant

            quant = Quant(quant.scale, quant.zero_point, 1)
        c = Constant(data, slope.dtype, quant, slope.name)
        alpha = ctx.constant_tensor(c, x.perm)
        ctx.emit("PRELU", [x, alpha], [ctx.output(node, x.perm)])


class Unary(OpConverter):
    """A layout-agnostic unary op with a fixed LiteRT builtin."""

    litert: ClassVar[str] = ""

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        x = ctx.input(node.args[0])
        ctx.emit(self.litert, [x], [ctx.output(node, x.perm)])


class Relu(Unary):
    ops = ("aten.relu.default",)
    litert = "RELU"


class Sigmoid(Unary):
    ops = ("aten.sigmoid.default",)
    litert = "LOGISTIC"
    constraints = ("int8 output scale 1/256, zero point -128",)


class Tanh(Unary):
    ops = ("aten.tanh.default",)
    litert = "TANH"
    constraints = ("int8 output scale 1/128, zero point 0",)


class Hardswish(Unary):
    ops = ("aten.hardswish.default",)
    preserve = ("aten.hardswish.default",)
    litert = "HARD_SWISH"


@hookimpl
def etforge_op_converters() -> list[OpConverter]:
    return [Relu(), Clamp(), LeakyRelu(), Prelu(), Sigmoid(), Tanh(), Hardswish()]


@hookimpl
def etforge_quantizer_rules() -> list[QuantRule]:
    return [
        QuantRule(ops=("aten.relu.default", "aten.relu_.default"), kind="io"),
        # Clamping on the input's grid is exact: q(clamp(x)) == clamp(q(x), q(lo), q(hi)).
        QuantRule(
            ops=(
                "aten.relu6.default",
                "aten.relu6_.default",
                "aten.hardtanh.default",
                "aten.hardtanh_.default",
                "aten.clamp.default",
            ),
            kind="shared",
            inputs=(0,),
        ),
        QuantRule(
            ops=(
                "aten.leaky_relu.default",
                "aten.leaky_relu_.default",
                "aten.hardswish.default",
                "aten.hardswish_.default",
            ),
            kind="io",
        ),
        QuantRule(ops=("aten.prelu.default",), kind="io"),
        QuantRule(
            ops=("aten.sigmoid.default", "aten.sigmoid_.default"), kind="fixed", fixed=(1.0 / 256.0, -128)
        ),
        QuantRule(ops=("aten.tanh.default", "aten.tanh_.default"), kind="fixed", fixed=(1.0 / 128.0, 0)),
    ]
