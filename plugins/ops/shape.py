"""Data movement: view / reshape / flatten / squeeze / unsqueeze, permute, cat, slice, select,
pad, clone, same-shape expand.

A permute relabels the stored layout (no op); reshapes need the logical order, so a
channels-last input is transposed back first unless only size-1 dims move.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from etforge.sdk import (
    EVERY_NPU,
    SUPPORTED,
    Constraint,
    OpConverter,
    QuantRule,
    Support,
    hookimpl,
    unsupported,
)

if TYPE_CHECKING:
    from torch.fx import Node

    from etforge.sdk import Constant, ConversionContext, TargetSpec, Value

#: The NPU names (``NpuSpec.declares``) this module's support checks read.
READS = (
    "max_rank",
    "max_view_rank",
    "shared_qparams_cat",
    "shared_qparams_pad",
    "shared_qparams_permute",
    "slice_unit_step",
    "slice_nonempty",
)


def _rank_ok(node: Node, target: TargetSpec) -> bool | str:
    from etforge.sdk import shape_of

    max_rank = target.npu.limit("max_rank", 6) if target.npu else 6
    ranks = [len(shape_of(node))] + [
        len(shape_of(a)) for a in node.all_input_nodes if a.meta.get("val") is not None
    ]
    return max(ranks) <= max_rank or f"rank {max(ranks)} > {max_rank}"


def _view_rank(node: Node, target: TargetSpec) -> bool | str:
    """Output rank within the NPU's reshape limit (``max_view_rank``), else the generic ``max_rank``."""
    from etforge.sdk import shape_of

    npu = target.npu
    if npu is None or "max_view_rank" not in npu.limits:
        return _rank_ok(node, target)
    rank = len(shape_of(node))
    return rank <= npu.limits["max_view_rank"] or f"rank {rank} > {npu.limits['max_view_rank']}"


def _shared(flag: str, every_input: bool = False) -> Callable[[Node, TargetSpec], bool | str]:
    """Input 0 (or every listed input, for cat) and the output share qparams when the NPU sets ``flag``.

    A constant input is exempt: it is folded at conversion (upstream: a static permute).
    """

    def test(node: Node, target: TargetSpec) -> bool | str:
        from etforge.sdk import is_constant, shares_qparams

        if target.npu is None or not target.npu.requirement(flag):
            return True
        if not every_input:
            return is_constant(node.args[0]) or shares_qparams(node)
        return shares_qparams(node, tuple((0, i) for i in range(len(node.args[0]))))

    return test


class Reshape(OpConverter):
    """Every view-like op: RESHAPE to the node's output shape."""

    targets = EVERY_NPU
    reads = READS

    moves_codes = True
    ops = (
        "aten.view_copy.default",
        "aten.view.default",
        "aten._unsafe_view.default",
        "aten.reshape.default",
        "aten.squeeze_copy.dims",
        "aten.squeeze_copy.dim",
        "aten.squeeze_copy.default",
        "aten.unsqueeze_copy.default",
        "aten.expand_dims.default",
    )
    constraints = (Constraint("rank <= npu max_view_rank (else max_rank)", _view_rank),)

    def is_noop(self, node: Node, target: TargetSpec, constant: object = None) -> bool:
        return True  # same bytes, another shape

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        from etforge.sdk import layout, shape_of

        v = ctx.value(node.args[0])
        out_shape = shape_of(node)
        if not layout.is_identity(v.perm) and not layout.is_trivial(v.shape, v.perm):
            if _flatten_into_fc(node, v.shape, out_shape, v.perm):
                # Keep the stored (channels-last) order; the FC weights absorb the permutation.
                import numpy as np

                order = np.arange(int(np.prod(v.shape[1:]))).reshape(v.shape[1:])
                cols = order.transpose([p - 1 for p in v.perm[1:]]).ravel()
                y = ctx.output(node, like=v)
                ctx.reshape(v, y, out_shape)
                y.columns = tuple(int(c) for c in cols)
                return
            v = ctx.input(node.args[0], layout.identity(v.rank))
        y = ctx.output(node, like=v)
        ctx.reshape(v, y, out_shape)


def _flatten_into_fc(
    node: Node, in_shape: tuple[int, ...], out_shape: tuple[int, ...], perm: tuple[int, ...]
) -> bool:
    """A (N, ...) -> (N, K) flatten whose every consumer (through Q/DQ) is an FC with constant weights."""
    from etforge.sdk import is_constant, is_dequantize, is_quantize, node_op

    if len(out_shape) != 2 or perm[0] != 0 or out_shape[0] != in_shape[0]:
        return False
    frontier, consumers = [node], []
    while frontier:
        n = frontier.pop()
        for u in n.users:
            if is_quantize(u) or is_dequantize(u):
                frontier.append(u)
            else:
                consumers.append((n, u))
    return bool(consumers) and all(
        node_op(u) == "aten.linear.default" and u.args[0] is src and is_constant(u.args[1])
        for src, u in consumers
    )


class Permute(OpConverter):
    """permute: no data moves; the output is the input's tensor with a relabelled layout."""

    targets = EVERY_NPU
    reads = READS

    moves_codes = True
    ops = (
        "aten.permute_copy.default",
        "aten.permute.default",
        "aten.transpose_copy.int",
        "aten.t_copy.default",
    )
    constraints = (
        Constraint(
            "input and output share qparams (npu shared_qparams_permute)", _shared("shared_qparams_permute")
        ),
    )
    #: A permute of a constant is a permuted constant: folded at conversion, never emitted.
    folds = (*ops, "aten.t.default")

    def fold_constant(self, node: Node, value: Constant) -> Constant:
        import numpy as np

        from etforge.sdk import Constant, Quant, const_perm, layout

        perm = const_perm(node, value.data.ndim)
        quant = value.quant
        if quant is not None and quant.per_channel:
            quant = Quant(quant.scale, quant.zero_point, layout.stored_axis(perm, quant.axis))
        return Constant(
            np.ascontiguousarray(np.transpose(value.data, perm)), value.dtype, quant, name=node.name
        )

    def is_noop(self, node: Node, target: TargetSpec, constant: object = None) -> bool:
        """A permute of a constant (folded at conversion) or one that only moves size-1 dims."""
        from etforge.sdk import const_perm, is_constant, shape_of

        if is_constant(node.args[0]):
            return True
        shape = shape_of(node.args[0])
        moved = [d for d in const_perm(node, len(shape)) if shape[d] != 1]
        return moved == sorted(moved)

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        from etforge.sdk import Value, const_perm, layout, shape_of

        v = ctx.value(node.args[0])
        q = const_perm(node, v.rank)
        inv_q = layout.inverse(q)
        out_perm = tuple(inv_q[p] for p in v.perm)
        out = Value(v.tensor, shape_of(node), out_perm, v.dtype, v.quant)
        ctx.alias(node, out)  # a quantize user on other qparams requantizes after it


class Identity(OpConverter):
    """clone / alias / contiguous copies: the output is the input."""

    targets = EVERY_NPU
    reads = READS

    moves_codes = True
    ops = (
        "aten.clone.default",
        "aten.alias_copy.default",
        "aten.alias.default",
        "aten._to_copy.default",
        "dim_order_ops._clone_dim_order.default",
        "dim_order_ops._to_dim_order_copy.default",
    )

    def is_noop(self, node: Node, target: TargetSpec, constant: object = None) -> bool:
        return True  # check() refuses dtype changes: the output is the input

    def check(self, node: Node, target: TargetSpec) -> Support:
        from etforge.sdk import tensor_meta

        src, dst = tensor_meta(node.args[0]), tensor_meta(node)
        if src is None or dst is None or src.dtype != dst.dtype:
            return unsupported("dtype conversion")
        return SUPPORTED

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        ctx.alias(node, ctx.value(node.args[0]))  # a quantize user on other qparams requantizes after it


class Cat(OpConverter):
    """CONCATENATION along the stored position of the logical axis (all inputs share a layout)."""

    targets = EVERY_NPU
    reads = READS

    ops = ("aten.cat.default",)
    constraints = (
        Constraint("rank <= npu max_rank", _rank_ok),
        Constraint(
            "inputs and output share qparams (npu shared_qparams_cat)",
            _shared("shared_qparams_cat", every_input=True),
        ),
    )

    def is_noop(self, node: Node, target: TargetSpec, constant: object = None) -> bool:
        """A concatenation of one (non-empty) tensor is that tensor."""
        from etforge.sdk import shape_of

        return len([a for a in node.args[0] if 0 not in shape_of(a)]) == 1

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        from etforge.sdk import layout, options, shape_of

        rank = len(shape_of(node))
        dim = int(node.args[1]) % rank if len(node.args) > 1 else 0
        items = [a for a in node.args[0] if 0 not in shape_of(a)]
        runtime = [a for a in items if not ctx.is_constant(a)]
        perm = ctx.value(runtime[0]).perm if runtime else layout.identity(rank)
        int8 = any(ctx.value(a).dtype == "int8" for a in runtime)
        ins = [ctx.broadcast_input(a, rank, perm, int8) for a in items]
        y = ctx.output(node, perm)
        ctx.emit(
            "CONCATENATION", ins, [y], options("ConcatenationOptions", axis=layout.stored_axis(perm, dim))
        )


def _slice_limits(node: Node, target: TargetSpec) -> bool | str:
    from etforge.sdk import arg, shape_of

    npu = target.npu
    if npu is None:
        return True
    step = int(arg(node, 4, "step", 1))
    if npu.requirement("slice_unit_step") and step != 1:
        return f"step {step}"
    if npu.requirement("slice_nonempty"):
        size = shape_of(node.args[0])[int(arg(node, 1, "dim", 0))]
        start, end = arg(node, 2, "start", None), arg(node, 3, "end", None)
        start = 0 if start is None else int(start)
        end = size if end is None else int(end)
        start = min(max(start + size if start < 0 else start, 0), size)
        end = min(max(end + size if end < 0 else end, 0), size)
        if start >= end:
            return f"empty slice {start}:{end}"
    return True


class Slice(OpConverter):
    """slice_copy -> STRIDED_SLICE in stored coordinates."""

    targets = EVERY_NPU
    reads = READS

    moves_codes = True
    ops = ("aten.slice_copy.Tensor", "aten.slice.Tensor")
    constraints = (
        Constraint("step 1 (npu slice_unit_step), start < end (npu slice_nonempty)", _slice_limits),
    )

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        from etforge.sdk import arg

        v = ctx.value(node.args[0])
        dim = int(arg(node, 1, "dim", 0)) % v.rank
        size = v.shape[dim]
        start = arg(node, 2, "start", None)
        end = arg(node, 3, "end", None)
        step = int(arg(node, 4, "step", 1))
        start = 0 if start is None else int(start)
        end = size if end is None else int(end)
        start = max(start + size, 0) if start < 0 else min(start, size)
        end = max(end + size, 0) if end < 0 else min(end, size)
        _strided_slice(ctx, v, dim, (start, end, step), ctx.output(node, v.perm, like=v))


def _strided_slice(
    ctx: ConversionContext, v: Value, dim: int, bounds: tuple[int, int, int], out: int | Value
) -> None:
    """STRIDED_SLICE of ``v`` along logical ``dim`` (``bounds``: start, end, step), every
    other axis whole, in ``v``'s stored coordinates."""
    import numpy as np

    from etforge.sdk import options

    begin, stop, strides = [0] * v.rank, list(v.stored_shape), [1] * v.rank
    pos = v.perm.index(dim)
    begin[pos], stop[pos], strides[pos] = bounds
    consts = [
        ctx.add_constant(np.asarray(a, np.int32), "int32", n)
        for a, n in ((begin, "begin"), (stop, "end"), (strides, "strides"))
    ]
    ctx.emit("STRIDED_SLICE", [v, *consts], [out], options("StridedSliceOptions"))


class Select(OpConverter):
    """select_copy(dim, i): STRIDED_SLICE of index ``i`` in stored coordinates, then a RESHAPE
    that drops the (now size-1) axis, which keeps every other axis in its stored order.

    ``nn.MultiheadAttention`` picks q, k and v out of its packed in-projection this way."""

    targets = EVERY_NPU
    reads = READS

    moves_codes = True
    ops = ("aten.select_copy.int", "aten.select.int")
    constraints = (Constraint("rank <= npu max_rank", _rank_ok),)

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        from etforge.sdk import layout, shape_of

        v = ctx.value(node.args[0])
        dim = int(node.args[1]) % v.rank
        index = int(node.args[2]) % v.shape[dim]
        kept = [*v.stored_shape]
        kept[v.perm.index(dim)] = 1
        sliced = ctx.temp(kept, v.dtype, "select", v.quant)
        _strided_slice(ctx, v, dim, (index, index + 1, 1), sliced)
        perm = tuple(p - (p > dim) for p in v.perm if p != dim)
        y = ctx.output(node, perm, like=v)
        ctx.reshape(sliced, y, layout.apply(shape_of(node), perm))


def _same_shape(node: Node, target: TargetSpec) -> bool | str:
    from etforge.sdk import shape_of

    src, dst = tuple(shape_of(node.args[0])), tuple(shape_of(node))
    return src == dst or f"broadcasts {list(src)} to {list(dst)} (only a same-shape expand has an NPU form)"


class Expand(Identity):
    """expand_copy to the input's own shape: the output is the input (a matmul on 4-D
    operands reaches the Edge program as ``expand`` + ``view`` + ``bmm``)."""

    ops = ("aten.expand_copy.default", "aten.expand.default")
    constraints = (Constraint("output shape equals the input shape", _same_shape),)


def _pad_non_negative(node: Node, target: TargetSpec) -> bool | str:
    pads = [int(p) for p in node.args[1]]
    return all(p >= 0 for p in pads) or f"negative padding (cropping) {pads}"


class ConstantPad(OpConverter):
    """constant_pad_nd -> PAD (zero / zero point) or PADV2 (other values)."""

    targets = EVERY_NPU
    reads = READS

    ops = ("aten.constant_pad_nd.default",)
    constraints = (
        Constraint("non-negative padding", _pad_non_negative),
        Constraint("rank <= npu max_rank", _rank_ok),
        Constraint("input and output share qparams (npu shared_qparams_pad)", _shared("shared_qparams_pad")),
    )

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        import numpy as np

        v = ctx.value(node.args[0])
        pads = [int(p) for p in node.args[1]]
        value = float(node.args[2]) if len(node.args) > 2 else 0.0
        spec = np.zeros((v.rank, 2), np.int32)
        for i in range(len(pads) // 2):  # pads run from the last dim backwards
            dim = v.rank - 1 - i
            spec[v.perm.index(dim)] = (pads[2 * i], pads[2 * i + 1])
        pads_t = ctx.add_constant(spec, "int32", "paddings")
        y = ctx.output(node, v.perm)
        if value == 0.0:
            ctx.emit("PAD", [v, pads_t], [y])
            return
        q = v.quant
        if q is None:
            fill = np.asarray(value, np.float32)
        else:
            fill = np.asarray(np.clip(np.round(value / q.scale[0]) + q.zero_point[0], -128, 127), np.int8)
        fill_t = ctx.add_constant(fill, v.dtype, "pad_value", quant=q)
        ctx.emit("PADV2", [v, pads_t, fill_t], [y])


def _reflect_mode(node: Node, target: TargetSpec) -> bool | str:
    mode = node.args[2] if len(node.args) > 2 else node.kwargs.get("mode", "constant")
    if mode != "reflect":
        return (
            f"mode {mode!r} (constant pads become constant_pad_nd; replicate and circular have no LiteRT op)"
        )
    value = node.args[3] if len(node.args) > 3 else node.kwargs.get("value")
    return value is None or f"value {value} with mode 'reflect'"


class ReflectPad(OpConverter):
    """``pad(mode="reflect")`` kept whole -> MIRROR_PAD (REFLECT), as upstream's pad converter;
    ``to_edge`` would otherwise decompose it into index arithmetic the NPU does not run."""

    targets = EVERY_NPU
    reads = READS

    ops = ("aten.pad.default",)
    preserve = ("aten.pad.default",)
    litert = "MIRROR_PAD"
    constraints = (
        Constraint("mode 'reflect'", _reflect_mode),
        Constraint("non-negative padding", _pad_non_negative),
        Constraint("rank <= npu max_rank", _rank_ok),
        Constraint("input and output share qparams (npu shared_qparams_pad)", _shared("shared_qparams_pad")),
    )

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        import numpy as np

        from etforge.sdk import options

        v = ctx.value(node.args[0])
        pads = [int(p) for p in node.args[1]]
        spec = np.zeros((v.rank, 2), np.int32)
        for i in range(len(pads) // 2):  # pads run from the last dim backwards
            spec[v.perm.index(v.rank - 1 - i)] = (pads[2 * i], pads[2 * i + 1])
        pads_t = ctx.add_constant(spec, "int32", "paddings")
        y = ctx.output(node, v.perm)
        ctx.emit("MIRROR_PAD", [v, pads_t], [y], options("MirrorPadOptions", mode=0))  # 0: REFLECT


@hookimpl
def etforge_op_converters() -> list[OpConverter]:
    return [Reshape(), Permute(), Identity(), Expand(), Cat(), Slice(), Select(), ConstantPad(), ReflectPad()]


@hookimpl
def etforge_quantizer_rules() -> list[QuantRule]:
    # LiteRT moves int8 data without rescaling: outputs share the input's qparams.
    return [
        QuantRule(
            ops=(
                "aten.view.default",
                "aten.reshape.default",
                "aten.flatten.using_ints",
                "aten.squeeze.dim",
                "aten.squeeze.dims",
                "aten.squeeze.default",
                "aten.unsqueeze.default",
                "aten.permute.default",
                "aten.transpose.int",
                "aten.t.default",
                "aten.slice.Tensor",
                "aten.select.int",
                "aten.expand.default",
                "aten.clone.default",
                "aten.contiguous.default",
                "aten.constant_pad_nd.default",
                "aten.pad.default",
                "aten._unsafe_view.default",
                # identities in eval (to_edge makes them clones): without a rule, the next
                # op would observe the same values again and requantize them on the NPU
                "aten.dropout.default",
                "aten.feature_dropout.default",
                "aten.alpha_dropout.default",
                "aten.feature_alpha_dropout.default",
            ),
            kind="shared",
            inputs=(0,),
        ),
        QuantRule(
            ops=("aten.cat.default", "aten.concat.default", "aten.concatenate.default"),
            kind="shared",
            inputs=(0,),
        ),
    ]
