"""Activations: relu, relu6/hardtanh/clamp, leaky_relu, prelu, sigmoid, tanh, hardswish."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from etforge.sdk import EVERY_NPU, Constraint, OpConverter, QuantRule, hookimpl

if TYPE_CHECKING:
    from torch.fx import Node

    from etforge.sdk import ConversionContext, TargetSpec

#: LiteRT builtins for clamp ranges it has a dedicated op for.
_RANGES = {(0.0, 6.0): "RELU6", (-1.0, 1.0): "RELU_N1_TO_1", (0.0, None): "RELU"}

#: Activations a LiteRT conv / fully-connected op can fuse: the ``fuse=`` of their quantizer
#: rules (the rule of each activation says which of its nodes can, see ``activation_kind``).
FUSABLE_ACTIVATIONS = (
    "aten.relu.default",
    "aten.relu_.default",
    "aten.relu6.default",
    "aten.hardtanh.default",
    "aten.hardtanh_.default",
)

#: The NPU names (``NpuSpec.declares``) this module's support checks read.
READS = ("clamp_needs_a_bound", "clamp_shared_qparams_unless_relu", "binary_full_size_operand")


def activation_kind(node: Node) -> str | None:
    """The LiteRT fused activation an activation node is (RELU, RELU6, RELU_N1_TO_1), else None."""
    from etforge.sdk import node_op

    name = node_op(node)
    if name in {"aten.relu.default", "aten.relu_.default"}:
        return "RELU"
    if name in {"aten.relu6.default", "aten.relu6_.default"}:
        return "RELU6"
    if name in {"aten.hardtanh.default", "aten.hardtanh_.default", "aten.clamp.default"}:
        if name.startswith("aten.hardtanh") and len(node.args) < 3:
            return None  # default (-1, 1) needs explicit handling by callers; keep it unfused
        if any(hasattr(v, "op") for v in node.args[1:3]):
            return None  # tensor bounds
        return _RANGES.get(_bounds(node))
    return None


def _bounds(node: Node) -> tuple[float | None, float | None]:
    from etforge.sdk import arg

    if "hardtanh" in str(node.target):
        return float(arg(node, 1, "min_val", -1.0)), float(arg(node, 2, "max_val", 1.0))
    lo, hi = arg(node, 1, "min"), arg(node, 2, "max")
    return (None if lo is None else float(lo)), (None if hi is None else float(hi))


#: Clamp ranges the Neutron IR has a ReLU-family op for (None: unbounded).
_RELU_RANGES = ((0.0, None), (0.0, 6.0), (-1.0, 1.0), (0.0, 1.0))


def collapsed_by_quantization(node: Node, lo: float | None, hi: float | None) -> bool:
    """Whether the int8 input's range leaves nothing of clamp(lo, hi): for a ReLU-family range,
    no bound quantizes strictly inside the range (the hinge is gone); for any other range, both
    bounds lie outside the representable values. False when the input is not per-tensor int8."""
    from etforge.sdk import input_qparams

    got = input_qparams(node, 0)
    if got is None:
        return False
    scale, zp, dtype = got
    if isinstance(scale, list | tuple) or isinstance(zp, list | tuple) or "int8" not in str(dtype):
        return False
    scale, zp = float(scale), int(zp)  # type: ignore[arg-type]
    qmin, qmax = (0, 255) if "uint8" in str(dtype) else (-128, 127)

    def q(v: float) -> float:
        return min(max(round(v / scale) + zp, qmin), qmax)

    if (lo, hi) in _RELU_RANGES:
        low = q(0.0 if lo is None else lo)
        if hi is None:
            return not qmin < low < qmax
        return not (qmin < low or q(hi) < qmax)
    return (lo is None or lo <= (qmin - zp) * scale) and (hi is None or (qmax - zp) * scale <= hi)


def _scalar_bounds(node: Node, target: TargetSpec) -> bool:
    from etforge.sdk import arg

    return not any(hasattr(v, "op") for v in (arg(node, 1, "min"), arg(node, 2, "max")))


def _finite_bounds(node: Node) -> tuple[float | None, float | None]:
    import math

    lo, hi = _bounds(node)
    return (
        None if lo is None or math.isinf(lo) else lo,
        None if hi is None or math.isinf(hi) else hi,
    )


def _clamp_bounded(node: Node, target: TargetSpec) -> bool | str:
    if target.npu is None or not target.npu.requirement("clamp_needs_a_bound"):
        return True
    return _finite_bounds(node) != (None, None) or "no finite bound"


def _clamp_qparams(node: Node, target: TargetSpec) -> bool | str:
    """A ReLU-family range converts to one op; any other range (MIN/MAX) needs equal in/out qparams."""
    from etforge.sdk import input_qparams, output_qparams, shares_qparams

    npu = target.npu
    if npu is None or not npu.requirement("clamp_shared_qparams_unless_relu"):
        return True
    if _finite_bounds(node) in _RELU_RANGES:
        return True
    if input_qparams(node, 0) is None or output_qparams(node) is None:
        return "not quantized on both sides"
    return shares_qparams(node)


class Clamp(OpConverter):
    """hardtanh / clamp: RELU6, RELU_N1_TO_1 or RELU when the range matches, else MAXIMUM/MINIMUM."""

    targets = EVERY_NPU
    reads = READS

    ops = ("aten.hardtanh.default", "aten.clamp.default")
    constraints = (
        Constraint("scalar bounds", _scalar_bounds),
        Constraint("a finite bound (npu clamp_needs_a_bound)", _clamp_bounded),
        Constraint(
            "a ReLU-family range, or input and output share qparams (npu clamp_shared_qparams_unless_relu)",
            _clamp_qparams,
        ),
    )

    def fused_activation(self, node: Node) -> str | None:
        return activation_kind(node)

    def is_noop(self, node: Node, target: TargetSpec, constant: object = None) -> bool:
        return collapsed_by_quantization(node, *_finite_bounds(node))

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
            from etforge.sdk import Value

            tmp = ctx.temp(cur.stored_shape, cur.dtype, op.lower(), q)
            ctx.emit(op, [cur, c], [tmp])
            cur = Value(tmp, cur.shape, cur.perm, cur.dtype, q)


class LeakyRelu(OpConverter):
    targets = EVERY_NPU
    reads = READS
    ops = ("aten.leaky_relu.default",)

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        from etforge.sdk import arg, options

        x = ctx.input(node.args[0])
        alpha = float(arg(node, 1, "negative_slope", 0.01))
        ctx.emit("LEAKY_RELU", [x], [ctx.output(node, x.perm)], options("LeakyReluOptions", alpha=alpha))


def _constant_slope(node: Node, target: TargetSpec) -> bool:
    from etforge.sdk import is_constant

    return is_constant(node.args[1])


def _full_size_operand(node: Node, target: TargetSpec) -> bool | str:
    from etforge.sdk import has_full_size_operand

    if target.npu is None or not target.npu.requirement("binary_full_size_operand"):
        return True
    return has_full_size_operand(node)


class Prelu(OpConverter):
    """PRELU with the slope broadcast over channels (stored in the input's layout)."""

    targets = EVERY_NPU
    reads = READS

    ops = ("aten._prelu_kernel.default", "aten.prelu.default")
    preserve = ("aten.prelu.default",)
    constraints = (
        Constraint("constant slope", _constant_slope),
        Constraint("an input as large as the output (npu binary_full_size_operand)", _full_size_operand),
    )

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        from etforge.sdk import Constant

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
            from etforge.sdk import Quant

            quant = Quant(quant.scale, quant.zero_point, 1)
        c = Constant(data, slope.dtype, quant, slope.name)
        alpha = ctx.constant_tensor(c, x.perm)
        ctx.emit("PRELU", [x, alpha], [ctx.output(node, x.perm)])


def _fixed_output(scale: float, zero_point: int) -> Callable[[Node, TargetSpec], bool | str]:
    """LiteRT's int8 kernel produces this output quantization (the quantizer rule fixes it)."""

    def test(node: Node, target: TargetSpec) -> bool | str:
        from etforge.sdk import output_qparams

        q = output_qparams(node)
        if q is None or (abs(float(q[0]) - scale) <= 1e-9 and int(q[1]) == zero_point):
            return True
        return f"output scale {float(q[0]):.6g}, zero point {q[1]}"

    return test


def _one_domain(node: Node, target: TargetSpec) -> bool | str:
    """LiteRT's LOGISTIC, TANH and HARD_SWISH take and give one type: an int8 input with a float
    output (a composite op quantized whole, then decomposed: SiLU's sigmoid) does not load."""
    from etforge.sdk import input_qparams, output_qparams

    quantized_in, quantized_out = input_qparams(node, 0) is not None, output_qparams(node) is not None
    if quantized_in == quantized_out:
        return True
    return "int8 input, float output" if quantized_in else "float input, int8 output"


#: The constraint every one-type LiteRT activation states.
ONE_DOMAIN = Constraint("input and output both int8 or both float", _one_domain)


class Unary(OpConverter):
    """A layout-agnostic unary op with a fixed LiteRT builtin."""

    targets = EVERY_NPU
    reads = READS

    litert: ClassVar[str] = ""

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        x = ctx.input(node.args[0])
        ctx.emit(self.litert, [x], [ctx.output(node, x.perm)])


class Relu(Unary):
    ops = ("aten.relu.default",)
    litert = "RELU"

    def fused_activation(self, node: Node) -> str | None:
        return "RELU"

    def is_noop(self, node: Node, target: TargetSpec, constant: object = None) -> bool:
        return collapsed_by_quantization(node, 0.0, None)


class Sigmoid(Unary):
    ops = ("aten.sigmoid.default",)
    litert = "LOGISTIC"
    constraints = (
        ONE_DOMAIN,
        Constraint("int8 output scale 1/256, zero point -128", _fixed_output(1.0 / 256.0, -128)),
    )


class Tanh(Unary):
    ops = ("aten.tanh.default",)
    litert = "TANH"
    constraints = (
        ONE_DOMAIN,
        Constraint("int8 output scale 1/128, zero point 0", _fixed_output(1.0 / 128.0, 0)),
    )


class Hardswish(Unary):
    ops = ("aten.hardswish.default",)
    preserve = ("aten.hardswish.default",)
    litert = "HARD_SWISH"
    constraints = (ONE_DOMAIN,)


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
            # fused into a producer's output only when LiteRT has that activation
            fusable=lambda node: activation_kind(node) is not None,
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
