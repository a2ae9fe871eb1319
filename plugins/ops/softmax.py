"""softmax -> SOFTMAX over the stored last axis (int8 output fixed at 1/256, -128).

A softmax over another stored axis (off the channel axis of a channels-last tensor) is
transposed to put its dim last first; its output keeps that order (docs/targets.md,
"Neutron details").
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from etforge.sdk import EVERY_NPU, Constraint, OpConverter, QuantRule, hookimpl

if TYPE_CHECKING:
    from torch.fx import Node

    from etforge.sdk import ConversionContext, TargetSpec

#: The NPU names (``NpuSpec.declares``) this module's support checks read.
READS = ("max_softmax_channels", "max_softmax_spatial", "max_softmax_elements")


def _sizes(node: Node, target: TargetSpec) -> bool | str:
    """Channels (the softmax dim), spatial (every other dim, batch included) and their product."""
    from math import prod

    from etforge.sdk import shape_of

    npu = target.npu
    assert npu is not None
    shape = shape_of(node)
    channels = shape[int(node.args[1]) % len(shape)]
    spatial = prod(shape) // max(channels, 1)
    for what, value, key in (
        ("channels", channels, "max_softmax_channels"),
        ("spatial size", spatial, "max_softmax_spatial"),
        ("elements", channels * spatial, "max_softmax_elements"),
    ):
        if key in npu.limits and value > npu.limits[key]:
            return f"{what} {value} > {npu.limits[key]}"
    return True


class Softmax(OpConverter):
    targets = EVERY_NPU
    reads = READS
    ops = ("aten._softmax.default", "aten.softmax.int")
    constraints = (
        Constraint(
            "channels <= npu max_softmax_channels, spatial (N*H*W) <= max_softmax_spatial, "
            "channels * spatial <= max_softmax_elements",
            _sizes,
        ),
    )

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        from etforge.sdk import options

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
