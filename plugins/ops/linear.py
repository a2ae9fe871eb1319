"""Matrix products: linear / addmm / mm with constant weights -> FULLY_CONNECTED; bmm and
runtime-by-runtime mm -> BATCH_MATMUL."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from etforge.plugins.ops.activation import FUSABLE_ACTIVATIONS
from etforge.sdk import EVERY_NPU, Constraint, OpConverter, QuantRule, hookimpl

if TYPE_CHECKING:
    from torch.fx import Node

    from etforge.sdk import Constant, ConversionContext, TargetSpec

#: The NPU names (``NpuSpec.declares``) this module's support checks read.
READS = ("addmm_bias_row", "matmul_constant_rhs", "batch_matmul_zero_points")


def _fully_connected(ctx: ConversionContext, node: Node, x_arg: object, w: Constant, bias: object) -> None:
    """y = x @ w.T + b over the last dim; ``w`` is (out_features, in_features)."""
    from etforge.sdk import Constant, activation, bias_tensor, options

    act, out_node = ctx.fuse_activation(node)
    x = ctx.input_columns(x_arg)
    if x.columns is not None:  # a channels-last flatten: reorder the weight's columns instead
        w = Constant(w.data[:, list(x.columns)], w.dtype, w.quant, w.name)
    wt = ctx.constant_tensor(w)
    b = bias_tensor(ctx, bias, w.data.shape[0], x, w.quant, "bias")
    y = ctx.output(out_node)
    opts = options("FullyConnectedOptions", fusedActivationFunction=activation(act), keepNumDims=x.rank > 2)
    ctx.emit("FULLY_CONNECTED", [x, wt, b], [y], opts)


def _linear_constant(node: Node, target: TargetSpec) -> bool:
    from etforge.sdk import is_constant

    bias = node.args[2] if len(node.args) > 2 else None
    return is_constant(node.args[1]) and (bias is None or is_constant(bias))


class Linear(OpConverter):
    """FULLY_CONNECTED (fusing a following relu / relu6)."""

    targets = EVERY_NPU
    reads = READS

    ops = ("aten.linear.default",)
    preserve = ("aten.linear.default",)
    constraints = (Constraint("constant weight and bias", _linear_constant),)

    def macs(self, node: Node) -> int:
        from math import prod

        from etforge.sdk import shape_of

        return prod(shape_of(node)) * shape_of(node.args[1])[1]

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        w = ctx.constant(node.args[1])
        assert w is not None
        _fully_connected(ctx, node, node.args[0], w, node.args[2] if len(node.args) > 2 else None)


def _operands(node: Node) -> tuple[object, object, object]:
    """(left, right, bias) of addmm / mm / bmm."""
    if "addmm" in str(node.target):
        return node.args[1], node.args[2], node.args[0]
    return node.args[0], node.args[1], None


def _unit_alpha_beta(node: Node, target: TargetSpec) -> bool | str:
    beta, alpha = node.kwargs.get("beta", 1), node.kwargs.get("alpha", 1)
    return (beta == 1 and alpha == 1) or f"beta={beta}, alpha={alpha}"


def _runtime_left(node: Node, target: TargetSpec) -> bool:
    from etforge.sdk import is_constant

    return not is_constant(_operands(node)[0])


def _addmm_constants(node: Node, target: TargetSpec) -> bool:
    from etforge.sdk import is_constant

    _, b, bias = _operands(node)
    return bias is None or (is_constant(b) and is_constant(bias))


def _addmm_bias_row(node: Node, target: TargetSpec) -> bool | str:
    """addmm's bias is [P] or [1, P] (not a full [N, P] matrix or a broadcast scalar)."""
    from etforge.sdk import shape_of

    _, _, bias = _operands(node)
    if bias is None or target.npu is None or not target.npu.requirement("addmm_bias_row"):
        return True
    p = shape_of(node)[-1]
    shape = list(shape_of(bias))
    return shape in ([p], [1, p]) or f"bias shape {shape}"


def _mm_constant_rhs(node: Node, target: TargetSpec) -> bool:
    from etforge.sdk import is_constant

    if "aten.mm." not in str(node.target) or target.npu is None:
        return True
    return not target.npu.requirement("matmul_constant_rhs") or is_constant(node.args[1])


def _bmm_zero_points(node: Node, target: TargetSpec) -> bool | str:
    from etforge.sdk import input_qparams

    allowed = target.npu.choices.get("batch_matmul_zero_points") if target.npu else None
    if "bmm" not in str(node.target) or allowed is None:
        return True
    zps = [q[1] if (q := input_qparams(node, i)) is not None else None for i in (0, 1)]
    return all(z in allowed for z in zps) or f"input zero points {zps}, allowed {list(allowed)}"


class MatMul(OpConverter):
    """addmm / mm: FULLY_CONNECTED when the right operand is constant, else BATCH_MATMUL."""

    targets = EVERY_NPU
    reads = READS

    ops = ("aten.addmm.default", "aten.mm.default", "aten.bmm.default")
    constraints = (
        Constraint("addmm: beta == alpha == 1", _unit_alpha_beta),
        Constraint("addmm: constant matrix and bias", _addmm_constants),
        Constraint("addmm: bias [P] or [1, P] (npu addmm_bias_row)", _addmm_bias_row),
        Constraint("runtime left operand", _runtime_left),
        Constraint("mm: constant right operand (npu matmul_constant_rhs)", _mm_constant_rhs),
        Constraint("bmm: input zero points in npu batch_matmul_zero_points", _bmm_zero_points),
    )

    def _operands(self, node: Node) -> tuple[object, object, object]:
        return _operands(node)

    def macs(self, node: Node) -> int:
        from math import prod

        from etforge.sdk import shape_of

        a, _, _ = self._operands(node)
        return prod(shape_of(node)) * shape_of(a)[-1]

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        from etforge.sdk import Constant, layout, options

        a, b, bias = self._operands(node)
        bconst = ctx.constant(b)
        if bconst is not None and bconst.data.ndim == 2:
            q = bconst.quant
            if q is not None and q.per_channel:
                from etforge.sdk import Quant

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


def _symmetric_inputs(node: Node, specs: Any) -> bool:
    """Batched matmul with per-tensor symmetric int8 inputs (zero point 0), affine output.

    The Neutron NPU's batched matmul takes zero-point-0 inputs only (``neutron`` scheme).
    """
    import torch
    from torch.fx import Node as FxNode
    from torchao.quantization.pt2e.observer import MinMaxObserver, MovingAverageMinMaxObserver
    from torchao.quantization.pt2e.quantizer import QuantizationAnnotation, QuantizationSpec

    from etforge.sdk import shape_of, tensor_meta

    inputs = [a for a in node.args[:2] if isinstance(a, FxNode) and tensor_meta(a) is not None]
    if len(inputs) != 2 or any(not tensor_meta(a).dtype.is_floating_point for a in inputs):
        return False
    if any(len(shape_of(a)) < 3 for a in inputs):
        # 2-D: an mm, whose right operand the NPU wants constant (a weight): plain "io"
        node.meta["quantization_annotation"] = QuantizationAnnotation(
            input_qspec_map={a: specs.activation for a in inputs},
            output_qspec=specs.activation,
            _annotated=True,
        )
        return True
    ctr = MovingAverageMinMaxObserver if specs.is_qat else MinMaxObserver
    if specs.is_qat:
        from torchao.quantization.pt2e.fake_quantize import FakeQuantize

        obs = FakeQuantize.with_args(observer=ctr, eps=2**-12)
    else:
        obs = ctr.with_args(eps=2**-12)
    sym = QuantizationSpec(
        dtype=torch.int8,
        quant_min=-127,
        quant_max=127,
        qscheme=torch.per_tensor_symmetric,
        observer_or_fake_quant_ctr=obs,
    )
    node.meta["quantization_annotation"] = QuantizationAnnotation(
        input_qspec_map={a: sym for a in inputs}, output_qspec=specs.activation, _annotated=True
    )
    return True


@hookimpl
def etforge_quantizer_rules() -> list[QuantRule]:
    return [
        QuantRule(
            ops=("aten.bmm.default", "aten.matmul.default"),
            kind="custom",
            scheme="neutron",
            annotate=_symmetric_inputs,
        ),
        QuantRule(ops=("aten.linear.default",), kind="weighted", fuse=FUSABLE_ACTIVATIONS),
        QuantRule(ops=("aten.mm.default", "aten.bmm.default", "aten.matmul.default"), kind="io"),
        QuantRule(ops=("aten.addmm.default",), kind="io", inputs=(1, 2)),
    ]
