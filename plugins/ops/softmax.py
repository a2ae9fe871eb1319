"""softmax -> SOFTMAX over the stored last axis (int8 output fixed at 1/256, -128)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from etforge.core.converter import SUPPORTED, OpConverter, Support, unsupported
from etforge.core.hookspecs import hookimpl
from etforge.core.quant_rule import QuantRule

if TYPE_CHECKING:
    from torch.fx import Node

    from etforge.core.litert_convert import ConversionContext
    from etforge.core.target import TargetSpec


class Softmax(OpConverter):
    ops = ("aten._softmax.default", "aten.softmax.int")
    constraints = (
        "channels <= npu max_softmax_channels",
        "spatial <= max_softmax_spatial",
        "channels * spatial <= max_softmax_elements",
    )

    def check(self, node: Node, target: TargetSpec) -> Support:
        from math import prod

        from etforge.core.graph_utils import shape_of

        shape = shape_of(node)
        dim = int(node.args[1]) % len(shape)
        channels = shape[dim]
        spatial = prod(shape) // max(channels, 1) // max(shape[0], 1)
        npu = target.npu
        assert npu is not None
        if channels > npu.limit("max_softmax_channels", 1 << 30):
            return unsupported(f"softmax over {channels} channels")
        if spatial > npu.limit("max_softmax_spatial", 1 << 30):
            return unsupported(f"softmax spatial size {spatial}")
        if channels * spatial > npu.limit("max_softmax_elements", 1 << 62):
            return unsupported(f"softmax of {channels * spatial} elements")
        return SUPPORTED

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        from etforge.core.litert import options

        v = ctx.value(node.args[0])
        dim = int(node.args[1]) % v.rank
        if v.perm[-1] != dim:
            perm = tuple(d for d in range(v.rank) if d != dim) + (dim,)
            v = ctx.input(node.args[0], perm)
        ctx.emit("SOFTMAX", [v], [ctx.output(node, v.perm)], options("SoftmaxOptions", beta=1.0))


@hookimpl
def etforge_op_converters() -> list[OpConverter]:
    return [Softmax()]


@hookimpl
def etforge_quantizer_rules() -> list[QuantRule]:
    return [
        QuantRule(
            ops=("aten.softmax.int", "aten._softmax.default"),
            kind="fixed",
            fixed=(1.0 / 256.0, -128),
            inputs=(0,),
        )
    ]
