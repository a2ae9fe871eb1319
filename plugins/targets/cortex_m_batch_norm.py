"""A BatchNorm no layer folds, as a layer CMSIS-NN runs in int8 on the Cortex-M.

PT2E folds a BatchNorm into the conv or 2-D linear before it; any other one (on the model's
input, after a pool, a transpose or a reshape) is its per-channel affine map, which the
generic rewrite spells as a float ``mul`` + ``add`` on 2-D and 3-D tensors (CMSIS-NN's
elementwise kernels broadcast a per-channel operand over NHWC tensors only): it ran in float
on the CPU. Here, on 2-D ``[N, C]`` it is a linear with a diagonal weight (``C x C`` MACs)
and on 3-D ``[N, C, L]`` a depthwise 1x1 conv over a height-1 NHWC view — both int8 kernels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from etforge.sdk import Rewrite

if TYPE_CHECKING:
    from torch.fx import GraphModule, Node

    from etforge.sdk import TargetSpec

#: Producers PT2E folds a following BatchNorm into (left to that fold).
_FOLDED = ("aten.conv1d.default", "aten.conv2d.default", "aten.conv3d.default", "aten.convolution.default",
           "aten.conv1d.padding", "aten.conv2d.padding", "aten.conv_transpose1d.default",
           "aten.conv_transpose2d.input")  # fmt: skip


def _folded_by_pt2e(x: Node) -> bool:
    from etforge.sdk import node_op, val

    if getattr(x, "op", None) != "call_function":
        return False
    if node_op(x) == "aten.linear.default":
        v = val(x.args[0])
        return v is not None and v.dim() == 2
    return node_op(x) in _FOLDED


class BatchNormAsInt8Layer(Rewrite):
    description = (
        "eval batch_norm no layer folds, on 2-D or 3-D input -> a diagonal linear (2-D) or a "
        "depthwise 1x1 conv over a height-1 NHWC view (3-D): CMSIS-NN int8 kernels"
    )
    targets = ("cortex-m33",)
    order = -10  # before the generic StandaloneBatchNorm, which would make it float mul + add

    def apply(self, gm: GraphModule, target: TargetSpec) -> bool:
        import torch

        from etforge.sdk import batch_norm_affine, call, calls, constant, replace, val

        aten = torch.ops.aten
        changed = False
        for node in calls(gm, aten.batch_norm.default):
            x = node.args[0]
            v = val(x)
            if v is None or not v.is_floating_point() or v.dim() not in (2, 3) or _folded_by_pt2e(x):
                continue
            affine = batch_norm_affine(gm, node)
            if affine is None:
                continue
            scale, shift = (t.to(v.dtype) for t in affine)
            c = v.shape[1]
            b = constant(gm, shift.contiguous(), "bn_shift", node)
            if v.dim() == 2:
                w = constant(gm, torch.diag(scale).contiguous(), "bn_diag", node)
                out = call(gm, aten.linear.default, (x, w, b), node)
            else:
                w = constant(gm, scale.reshape(c, 1, 1, 1).contiguous(), "bn_weight", node)
                x4 = call(gm, aten.unsqueeze.default, (x, 2), node)
                x4 = call(gm, aten.clone.default, (x4,), node, kwargs={"memory_format": torch.channels_last})
                y4 = call(gm, aten.conv2d.default, (x4, w, b, [1, 1], [0, 0], [1, 1], c), node)
                out = call(gm, aten.squeeze.dims, (y4, [2]), node)
            replace(gm, node, out)
            changed = True
        return changed
