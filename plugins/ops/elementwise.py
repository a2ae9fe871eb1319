"""Elementwise arithmetic: add / sub / mul (broadcasting), maximum / minimum, abs / neg / exp / log / rsqrt.

Each op is data: Edge op, LiteRT builtin, arity. Binary ops broadcast; constants take the
runtime operand's layout at conversion time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from etforge.core.converter import SUPPORTED, Elementwise, OpConverter, Support, elementwise, unsupported
from etforge.core.hookspecs import hookimpl
from etforge.core.quant_rule import QuantRule

if TYPE_CHECKING:
    from torch.fx import Node

    from etforge.core.target import TargetSpec


class AddSub(Elementwise):
    """ADD / SUB; ``alpha`` other than 1 is refused (it would need a MUL first)."""

    arity = 2
    constraints = ("alpha == 1", "rank <= 4 after broadcasting")

    def check(self, node: Node, target: TargetSpec) -> Support:
        if node.kwargs.get("alpha", 1) != 1:
            return unsupported(f"alpha={node.kwargs['alpha']}")
        return SUPPORTED


class Add(AddSub):
    ops = ("aten.add.Tensor",)
    litert = "ADD"


class Sub(AddSub):
    ops = ("aten.sub.Tensor",)
    litert = "SUB"


@hookimpl
def etforge_op_converters() -> list[OpConverter]:
    return [
        Add(),
        Sub(),
        elementwise("aten.mul.Tensor", "MUL", arity=2),
        elementwise("aten.maximum.default", "MAXIMUM", arity=2),
        elementwise("aten.minimum.default", "MINIMUM", arity=2),
        elementwise("aten.abs.default", "ABS"),
        elementwise("aten.neg.default", "NEG"),
        elementwise("aten.exp.default", "EXP"),
        elementwise("aten.log.default", "LOG"),
        elementwise("aten.rsqrt.default", "RSQRT"),
    ]


@hookimpl
def etforge_quantizer_rules() -> list[QuantRule]:
    return [
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
