"""Arithmetic with constants in the forms the NPU converters take.

Division by a constant as multiplication by its reciprocal: LiteRT's int8 DIV is not an NPU
op (upstream Neutron has no div converter); MUL is, and ``x / c == x * (1 / c)`` up to float
rounding. Attention's ``q·kᵀ / √d`` is the usual case.

An integer scalar operand of a float op as a float: ``to_edge`` turns ``x * 2`` into a MUL by
an int64 constant behind a float ``_to_dim_order_copy``, a float CPU op that kept the MUL off
the NPU on the classic lowering path (``x * 2.0`` is a plain constant; same value).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from etforge.sdk import Rewrite, hookimpl, replace

if TYPE_CHECKING:
    from torch.fx import GraphModule

    from etforge.sdk import TargetSpec


class DivByConstant(Rewrite):
    description = "div(x, c) with a constant c (scalar or get_attr tensor) -> mul(x, 1/c)"

    def apply(self, gm: GraphModule, target: TargetSpec) -> bool:
        import torch

        from etforge.sdk import call, calls, constant, val

        aten = torch.ops.aten
        changed = False
        for node in calls(gm, aten.div.Tensor, aten.div.Scalar):
            if node.kwargs.get("rounding_mode") is not None or len(node.args) != 2:
                continue
            x, d = node.args
            v = val(x)
            if v is None or not v.is_floating_point():
                continue
            if isinstance(d, (int, float)) and not isinstance(d, bool):
                if d == 0:
                    continue
                recip = torch.tensor(1.0 / float(d), dtype=v.dtype)
            elif getattr(d, "op", None) == "get_attr":
                t = val(d)
                if t is None or not t.is_floating_point() or bool((t == 0).any()):
                    continue
                recip = (1.0 / t.detach().double()).to(t.dtype)
            else:
                continue
            out = call(gm, aten.mul.Tensor, (x, constant(gm, recip, "reciprocal", node)), node)
            replace(gm, node, out)
            changed = True
        return changed


class IntScalarAsFloat(Rewrite):
    description = "add/sub/mul/rsub of a float tensor and an int scalar -> the scalar as a float"

    def apply(self, gm: GraphModule, target: TargetSpec) -> bool:
        import torch

        from etforge.sdk import calls, val

        aten = torch.ops.aten
        ops = (aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.rsub.Scalar)
        ops += (aten.add.Scalar, aten.sub.Scalar, aten.mul.Scalar)
        changed = False
        for node in calls(gm, *ops):
            if len(node.args) != 2:
                continue
            x, c = node.args
            v = val(x)
            if v is None or not v.is_floating_point() or type(c) is not int:
                continue
            node.args = (x, float(c))
            changed = True
        return changed


class FusedMultiplyAdd(Rewrite):
    """``addcmul`` / ``addcdiv`` as the products, quotient and sum they compute.

    No quantizer rule annotates them, and ``to_edge`` decomposes them after quantization, so
    their products reached the NPU with float values between them (timm's GRN,
    ``torch.addcmul(bias, weight, x)``: convnextv2 failed to compile). Split before
    quantization, each piece is quantized like any other mul, div and add."""

    description = (
        "addcmul(a, b, c, value) -> a + (b * c) * value; addcdiv(a, b, c, value) -> a + (b / c) * value"
    )

    def apply(self, gm: GraphModule, target: TargetSpec) -> bool:
        import torch

        from etforge.sdk import call, calls

        aten = torch.ops.aten
        changed = False
        for node in calls(gm, aten.addcmul.default, aten.addcdiv.default):
            if len(node.args) != 3 or set(node.kwargs) - {"value"}:
                continue
            a, b, c = node.args
            value = node.kwargs.get("value", 1)
            inner = aten.mul.Tensor if node.target == aten.addcmul.default else aten.div.Tensor
            term = call(gm, inner, (b, c), node)
            if value != 1:
                term = call(gm, aten.mul.Tensor, (term, float(value)), node)
            replace(gm, node, call(gm, aten.add.Tensor, (a, term), node))
            changed = True
        return changed


class SquareAsMul(Rewrite):
    """``x ** 2`` as ``x * x``: the variance of a hand-written norm (``(x - u).pow(2).mean(1)``,
    Hugging Face's and timm's channels-first LayerNorm) has no NPU op as a power, and torch
    computes a square as that product (the same float32 value)."""

    description = "pow(x, 2) -> mul(x, x)"

    def apply(self, gm: GraphModule, target: TargetSpec) -> bool:
        import torch

        from etforge.sdk import call, calls, val

        aten = torch.ops.aten
        changed = False
        for node in calls(gm, aten.pow.Tensor_Scalar):
            x, exponent = node.args[:2]
            v = val(x)
            if v is None or not v.is_floating_point() or exponent != 2 or isinstance(exponent, bool):
                continue
            replace(gm, node, call(gm, aten.mul.Tensor, (x, x), node))
            changed = True
        return changed


class DivBySqrt(Rewrite):
    """``a / sqrt(b)`` as ``a * rsqrt(b)``: a norm's ``(x - u) / torch.sqrt(var + eps)``. DIV is
    not an NPU op and int8 SQRT is not a LiteRT kernel; RSQRT and MUL are both (the same
    value up to float rounding)."""

    description = "div(a, sqrt(b)) -> mul(a, rsqrt(b))"

    def apply(self, gm: GraphModule, target: TargetSpec) -> bool:
        import torch

        from etforge.sdk import call, calls, val

        aten = torch.ops.aten
        changed = False
        for node in calls(gm, aten.div.Tensor):
            if len(node.args) != 2 or node.kwargs.get("rounding_mode") is not None:
                continue
            a, root = node.args
            if getattr(root, "target", None) is not aten.sqrt.default:
                continue
            va, vr = val(a), val(root)
            if va is None or vr is None or not (va.is_floating_point() and vr.is_floating_point()):
                continue
            inverse = call(gm, aten.rsqrt.default, (root.args[0],), node)
            replace(gm, node, call(gm, aten.mul.Tensor, (a, inverse), node))
            changed = True
        return changed


@hookimpl
def etforge_rewrites() -> list[Rewrite]:
    return [DivByConstant(), IntScalarAsFloat(), FusedMultiplyAdd(), SquareAsMul(), DivBySqrt()]
