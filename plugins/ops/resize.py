"""Upsampling: nearest -> RESIZE_NEAREST_NEIGHBOR, bilinear -> RESIZE_BILINEAR (NHWC)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from etforge.sdk import EVERY_NPU, Constraint, OpConverter, QuantRule, hookimpl

if TYPE_CHECKING:
    from torch.fx import Node

    from etforge.sdk import ConversionContext, TargetSpec

#: The NPU names (``NpuSpec.declares``) this module's support checks read.
READS = ("resize_scales",)


def _four_d(node: Node, target: TargetSpec) -> bool | str:
    from etforge.sdk import shape_of

    return len(shape_of(node)) == 4 or "non-4-D input"


def _align_corners(node: Node) -> bool:
    return "bilinear" in str(node.target) and len(node.args) > 2 and bool(node.args[2])


def _scales(node: Node, target: TargetSpec) -> bool | str:
    """H and W scale factors in the NPU's set (align_corners: (out - 1) / (in - 1))."""
    from etforge.sdk import shape_of

    allowed = target.npu.choices.get("resize_scales") if target.npu else None
    if allowed is None:
        return True
    (_, _, in_h, in_w), (_, _, out_h, out_w) = shape_of(node.args[0]), shape_of(node)
    if _align_corners(node):
        if 1 in (in_h, in_w):
            return f"align_corners with a {in_h}x{in_w} input"
        scales = ((out_h - 1) / (in_h - 1), (out_w - 1) / (in_w - 1))
    else:
        scales = (out_h / in_h, out_w / in_w)
    return (
        all(f in allowed for f in scales) or f"scales {[round(f, 4) for f in scales]} not in {list(allowed)}"
    )


class Resize(OpConverter):
    targets = EVERY_NPU
    reads = READS
    litert: ClassVar[str] = ""
    options_kind: ClassVar[str] = ""
    constraints = (
        Constraint("4-D", _four_d),
        Constraint("H and W scales in npu resize_scales", _scales),
    )

    def align_corners(self, node: Node) -> bool:
        return False

    def is_noop(self, node: Node, target: TargetSpec, constant: object = None) -> bool:
        """Scale 1 in H and W: the output is the input."""
        from etforge.sdk import shape_of

        return shape_of(node.args[0]) == shape_of(node)

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        import numpy as np

        from etforge.sdk import options, shape_of

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
