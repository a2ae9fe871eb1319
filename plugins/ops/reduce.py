"""Reductions over dims -> MEAN / SUM / REDUCE_MAX / REDUCE_MIN with axes in stored coordinates."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from etforge.sdk import EVERY_NPU, Constraint, OpConverter, QuantRule, hookimpl

if TYPE_CHECKING:
    from torch.fx import Node

    from etforge.sdk import ConversionContext, TargetSpec

#: The NPU names (``NpuSpec.declares``) this module's support checks read.
READS = ("shared_qparams_reduce",)


def _explicit_dims(node: Node, target: TargetSpec) -> bool | str:
    from etforge.sdk import arg

    if not arg(node, 1, "dim"):
        return "reduction over all dims without explicit dims"
    return node.kwargs.get("dtype") is None or "dtype argument"


def _shared(node: Node, target: TargetSpec) -> bool | str:
    from etforge.sdk import shares_qparams

    if target.npu is None or not target.npu.requirement("shared_qparams_reduce"):
        return True
    return shares_qparams(node)


class Reduce(OpConverter):
    targets = EVERY_NPU
    reads = READS
    litert: ClassVar[str] = ""
    constraints = (
        Constraint("explicit dims, no dtype change", _explicit_dims),
        Constraint("input and output share qparams (npu shared_qparams_reduce)", _shared),
    )

    def is_noop(self, node: Node, target: TargetSpec, constant: object = None) -> bool:
        """keepdim over size-1 dims only: the output is the input."""
        from etforge.sdk import arg, shape_of

        shape = shape_of(node.args[0])
        dims = arg(node, 1, "dim") or ()
        return bool(arg(node, 2, "keepdim", False)) and all(shape[int(d)] == 1 for d in dims)

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        import numpy as np

        from etforge.sdk import arg, options

        v = ctx.value(node.args[0])
        dims = sorted({int(d) % v.rank for d in arg(node, 1, "dim")})
        keep = bool(arg(node, 2, "keepdim", False))
        axes = ctx.add_constant(np.asarray(sorted(v.perm.index(d) for d in dims), np.int32), "int32", "axes")
        if keep:
            out_perm = v.perm
        else:  # remaining dims keep their stored order, renumbered
            rest = [d for d in v.perm if d not in dims]
            rank_of = {d: i for i, d in enumerate(sorted(rest))}
            out_perm = tuple(rank_of[d] for d in rest)
        y = ctx.output(node, out_perm)
        opts = options("ReducerOptions", keepDims=keep)
        if self.litert == "SUM" and y.quant is not None:
            # LiteRT's reference int8 SUM saturates instead of rescaling. MEAN rescales, and a
            # MEAN quantized at scale s/count holds exactly the bytes of the SUM at scale s.
            from math import prod

            from etforge.sdk import Quant

            count = prod(v.shape[d] for d in dims)
            mean_q = Quant.per_tensor(y.quant.scale[0] / count, y.quant.zero_point[0])
            tmp = ctx.temp(y.stored_shape, "int8", "mean", mean_q)
            ctx.emit("MEAN", [v, axes], [tmp], opts)
            ctx.reshape(tmp, y, y.stored_shape)
            return
        ctx.emit(self.litert, [v, axes], [y], opts)


class Amax(Reduce):
    """amax -> REDUCE_MAX (upstream's amax converter); the maximum keeps the input's qparams."""

    ops = ("aten.amax.default",)
    litert = "REDUCE_MAX"


class Amin(Reduce):
    """amin -> REDUCE_MIN (upstream's amin converter)."""

    ops = ("aten.amin.default",)
    litert = "REDUCE_MIN"


class Mean(Reduce):
    ops = ("aten.mean.dim",)
    litert = "MEAN"


class Sum(Reduce):
    ops = ("aten.sum.dim_IntList",)
    litert = "SUM"


@hookimpl
def etforge_op_converters() -> list[OpConverter]:
    return [Mean(), Sum(), Amax(), Amin()]


@hookimpl
def etforge_quantizer_rules() -> list[QuantRule]:
    return [
        QuantRule(ops=("aten.mean.dim", "aten.sum.dim_IntList"), kind="io", inputs=(0,)),
        # The Neutron NPU reduces without rescaling: output quantized like the input.
        QuantRule(
            ops=("aten.mean.dim", "aten.sum.dim_IntList"), kind="shared", inputs=(0,), scheme="neutron"
        ),
        # A maximum / minimum of int8 values is one of them: no requantization anywhere.
        QuantRule(ops=("aten.amax.default", "aten.amin.default"), kind="shared", inputs=(0,)),
    ]
