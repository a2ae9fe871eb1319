"""Elementwise arithmetic: add / sub / mul (broadcasting), maximum / minimum, abs / neg / exp / log / rsqrt.

Each op is data: Edge op, LiteRT builtin, arity. Binary ops broadcast; constants take the
runtime operand's layout at conversion time. A division by a tensor has no NPU form; its rule
keeps the divisor float (``_float_divisor``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from etforge.sdk import EVERY_NPU, Constraint, Elementwise, OpConverter, QuantRule, elementwise, hookimpl

if TYPE_CHECKING:
    from torch.fx import Node

    from etforge.sdk import ConversionContext, TargetSpec

#: The NPU names (``NpuSpec.declares``) this module's support checks read.
READS = ("binary_full_size_operand", "shared_qparams_minmax", "neg_per_tensor")


def _unit_alpha(node: Node, target: TargetSpec) -> bool | str:
    alpha = node.kwargs.get("alpha", 1)
    return alpha == 1 or f"alpha={alpha}"


def _full_size_operand(node: Node, target: TargetSpec) -> bool | str:
    from etforge.sdk import has_full_size_operand

    if target.npu is None or not target.npu.requirement("binary_full_size_operand"):
        return True
    return has_full_size_operand(node)


def _minmax_shared(node: Node, target: TargetSpec) -> bool | str:
    from etforge.sdk import input_qparams, output_qparams, shares_qparams

    if target.npu is None or not target.npu.requirement("shared_qparams_minmax"):
        return True
    if output_qparams(node) is None or any(input_qparams(node, i) is None for i in (0, 1)):
        return "not quantized on every input and the output"
    return shares_qparams(node, (0, 1))


def _per_tensor_input(node: Node, target: TargetSpec) -> bool | str:
    from etforge.sdk import input_qparams

    if target.npu is None or not target.npu.requirement("neg_per_tensor"):
        return True
    q = input_qparams(node, 0)
    return q is None or isinstance(q[0], float) or "per-channel quantized input"


def neutral_operand(node: Node, constant: object, neutral: float, positions: tuple[int, ...]) -> bool:
    """Whether an operand at one of ``positions`` is a compile-time ``neutral`` everywhere
    (x + 0, x - 0, x * 1) and the other operand already has the output's shape: then the
    output is that operand."""
    from torch.fx import Node as FxNode

    from etforge.sdk import shape_of, tensor_meta

    for i in positions:
        other = node.args[1 - i]
        if not isinstance(other, FxNode) or tensor_meta(other) is None:
            continue
        if shape_of(other) != shape_of(node):
            continue
        a = node.args[i]
        if isinstance(a, int | float):
            if float(a) == neutral:
                return True
            continue
        if value_of(a, constant) == neutral:
            return True
    return False


def value_of(a: object, constant: object) -> float | None:
    """The single value of compile-time tensor ``a`` as the int8 graph computes with it
    (through its quantize / dequantize), None if it is not a constant of one value."""
    from torch.fx import Node as FxNode

    from etforge.sdk import is_dequantize, is_quantize

    steps = []
    while isinstance(a, FxNode) and (is_dequantize(a) or is_quantize(a)):
        if not isinstance(a.args[1], float):
            return None  # per-channel
        steps.append((is_quantize(a), float(a.args[1]), int(a.args[2]), int(a.args[3]), int(a.args[4])))
        a = a.args[0]
    value = constant(a) if callable(constant) and isinstance(a, FxNode) else None
    if value is None or value.numel() == 0:
        return None
    v = value.double()
    for quantize, scale, zp, lo, hi in reversed(steps):
        v = (v / scale).round().add(zp).clamp(lo, hi) if quantize else (v - zp) * scale
    first = float(v.flatten()[0])
    return first if bool((v == first).all()) else None


_FULL = Constraint("an input as large as the output (npu binary_full_size_operand)", _full_size_operand)


class AddSub(Elementwise):
    """ADD / SUB; ``alpha`` other than 1 is refused (it would need a MUL first)."""

    targets = EVERY_NPU
    reads = READS

    arity = 2
    constraints = (Constraint("alpha == 1", _unit_alpha), _FULL)


class Add(AddSub):
    ops = ("aten.add.Tensor",)
    litert = "ADD"
    options_table = "AddOptions"

    def is_noop(self, node: Node, target: TargetSpec, constant: object = None) -> bool:
        return neutral_operand(node, constant, 0.0, (0, 1))


class Sub(AddSub):
    ops = ("aten.sub.Tensor",)
    litert = "SUB"
    options_table = "SubOptions"

    def is_noop(self, node: Node, target: TargetSpec, constant: object = None) -> bool:
        return neutral_operand(node, constant, 0.0, (1,))


class Mul(Elementwise):
    targets = EVERY_NPU
    reads = READS
    ops = ("aten.mul.Tensor",)
    litert = "MUL"
    options_table = "MulOptions"
    arity = 2
    constraints = (_FULL,)

    def is_noop(self, node: Node, target: TargetSpec, constant: object = None) -> bool:
        return neutral_operand(node, constant, 1.0, (0, 1))


class MinMax(Elementwise):
    targets = EVERY_NPU
    reads = READS
    arity = 2
    constraints = (
        _FULL,
        Constraint("inputs and output share qparams (npu shared_qparams_minmax)", _minmax_shared),
    )


class Maximum(MinMax):
    ops = ("aten.maximum.default",)
    litert = "MAXIMUM"


class Minimum(MinMax):
    ops = ("aten.minimum.default",)
    litert = "MINIMUM"


class Neg(Elementwise):
    """NEG; int8 as MUL by an exact -1 (code -127 at scale 1/127): LiteRT's int8 NEG negates
    the codes, ignoring the zero point, so it is wrong for any zero point but 0."""

    targets = EVERY_NPU
    reads = READS

    ops = ("aten.neg.default",)
    litert = "NEG"
    constraints = (Constraint("per-tensor quantized input (npu neg_per_tensor)", _per_tensor_input),)

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        import numpy as np

        from etforge.sdk import Quant, options

        if ctx.value(node.args[0]).dtype != "int8":
            ctx.emit_elementwise(node, self.litert, self.arity, self.options)
            return
        x = ctx.input(node.args[0])
        minus_one = ctx.add_constant(
            np.asarray([-127], np.int8), "int8", "minus_one", Quant.per_tensor(1 / 127, 0)
        )
        ctx.emit("MUL", [x, minus_one], [ctx.output(node, x.perm)], options("MulOptions"))


@hookimpl
def etforge_op_converters() -> list[OpConverter]:
    return [
        Add(),
        Sub(),
        Mul(),
        Maximum(),
        Minimum(),
        elementwise("aten.abs.default", "ABS", targets=EVERY_NPU),
        Neg(),
        elementwise("aten.exp.default", "EXP", targets=EVERY_NPU),
        elementwise("aten.log.default", "LOG", targets=EVERY_NPU),
        elementwise("aten.rsqrt.default", "RSQRT", targets=EVERY_NPU),
    ]


def _float_divisor(node: Node, specs: Any) -> bool:
    """A division by a tensor keeps its divisor's producer float (the division itself is the
    CPU quantizer's): int8 rounds a small positive divisor (``x + eps``, EfficientViT's
    linear attention) to 0, the quotient to inf or 0/0 = NaN, and a NaN has no int8 code
    (x86 and Arm convert it differently). Its inputs arrive dequantized; a constant operand
    (the eps) stays exact. Told as a fallback: the producer leaves the NPU."""
    from torch.fx import Node as FxNode

    from etforge.sdk import node_op, record_fallback, tensor_meta

    divisor = node.args[1] if len(node.args) > 1 else None
    meta = tensor_meta(divisor) if isinstance(divisor, FxNode) else None
    if meta is None or not meta.dtype.is_floating_point or divisor.op != "call_function":
        return False
    ann = divisor.meta.get("quantization_annotation")
    if ann is None or ann.output_qspec is None:
        return False
    ann.output_qspec = None
    ann.input_qspec_map = {}  # a constant operand (the eps) is not rounded either
    record_fallback(
        "quantize", "kept float (runs on the CPU)", f"{divisor.name} ({node_op(divisor)})",
        f"the divisor of {node.name}: int8 would round its small values to 0 and the quotient to inf/NaN",
    )  # fmt: skip
    return True


@hookimpl
def etforge_quantizer_rules() -> list[QuantRule]:
    return [
        QuantRule(ops=("aten.div.Tensor", "aten.div_.Tensor"), kind="custom", annotate=_float_divisor),
        QuantRule(
            ops=(
                "aten.add.Tensor",
                "aten.add_.Tensor",
                "aten.sub.Tensor",
                "aten.sub_.Tensor",
                "aten.mul.Tensor",
                "aten.mul_.Tensor",
            ),
            kind="io",
            fuse=("aten.relu.default", "aten.relu_.default"),
        ),
        # LiteRT's int8 MAXIMUM/MINIMUM compare raw values: inputs and output share qparams.
        QuantRule(ops=("aten.maximum.default", "aten.minimum.default"), kind="shared"),
        QuantRule(
            ops=(
                "aten.abs.default",
                "aten.neg.default",
                "aten.exp.default",
                "aten.log.default",
                "aten.rsqrt.default",
            ),
            kind="io",
        ),
    ]
