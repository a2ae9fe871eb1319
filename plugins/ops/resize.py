"""Upsampling: nearest -> RESIZE_NEAREST_NEIGHBOR, bilinear -> RESIZE_BILINEAR (NHWC)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from etforge.core.converter import SUPPORTED, OpConverter, Support, unsupported
from etforge.core.hookspecs import hookimpl
from etforge.core.quant_rule import QuantRule

if TYPE_CHECKING:
    from torch.fx import Node

    from etforge.core.litert_convert import ConversionContext
    from etforge.core.target import TargetSpec


class Resize(OpConverter):
    litert: ClassVar[str] = ""
    options_kind: ClassVar[str] = ""

    def check(self, node: Node, target: TargetSpec) -> Support:
        from etforge.core.graph_utils import shape_of

        if len(shape_of(node)) != 4:
            return unsupported("non-4-D input")
        return SUPPORTED

    def align_corners(self, node: Node) -> bool:
        return False

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        import numpy as np

        from etforge.core.graph_utils import shape_of
        from etforge.core.litert import options

        x = ctx.input(node.args[0], (0, 2, 3, 1))
        size = ctx.add_constant(np.asarray(shape_of(node)[2:], np.int32), "int32", "size")
        align = self.align_corners(node)
        opts = options(self.options_kind, alignCorners=align, halfPixelCenters=not align and self.half_pixel)
        ctx.emit(self.litert, [x, size], [ctx.output(node, (0, 2, 3, 1))], opts)

    half_pixel: ClassVar[bool] = False


class UpsampleNearest(Resize):
    """PyTorch 'nearest' takes floor(dst * in / out): LiteRT without half-pixel centers."""

    ops = ("aten.upsample_nearest2d.vec", "aten.upsample_nearest2d.default")
    litert = "RESIZE_NEAREST_NEIGHBOR"
    options_kind = "ResizeNearestNeighborOptions"


class UpsampleBilinear(Resize):
    ops = ("aten.upsample_bilinear2d.vec", "aten.upsample_bilinear2d.default")
    litert = "RESIZE_BILINEAR"
    options_kind = "ResizeBilinearOptions"
    half_pixel = True

    def align_corners(self, node: Node) -> bool:
        return bool(node.args[2]) if len(node.args) > 2 else False


@hookimpl
def etforge_op_converters() -> list[OpConverter]:
    return [UpsampleNearest(), UpsampleBilinear()]


@hookimpl
def etforge_quantizer_rules() -> list[QuantRule]:
    return [
        # LiteRT's int8 resize kernels interpolate raw values: output shares the input's qparams.
        QuantRule(
            ops=(
                "aten.upsample_nearest2d.vec",
                "aten.upsample_nearest2d.default",
                "aten.upsample_bilinear2d.vec",
                "aten.upsample_bilinear2d.default",
            ),
            kind="shared",
            inputs=(0,),
        ),
    ]
