"""1-D convolutions as 2-D ones of height 1, so CMSIS-NN runs them in int8 on the Cortex-M.

ExecuTorch's Cortex-M quantizer and passes take 2-D convolutions only: a ``conv1d`` stayed a
float ``aten.convolution`` on the portable kernels (a small keyword spotter: 50 M emulator
instructions). ``conv1d(x)`` is ``conv2d(x[:, :, None, :])[:, :, 0, :]`` with the weight
given a kernel height of 1 — the same sums, so the same float model. A following eval
BatchNorm is folded into the weights first (after the rewrite it would follow the squeeze,
where PT2E's conv fold no longer sees it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from etforge.sdk import Rewrite, batch_norm_after

if TYPE_CHECKING:
    from torch.fx import GraphModule

    from etforge.sdk import TargetSpec

#: ``aten.conv1d`` argument defaults after the weight: bias, stride, padding, dilation, groups.
_DEFAULTS: tuple[Any, ...] = (None, 1, 0, 1, 1)


def _one(value: Any) -> int:
    return int(value[0]) if isinstance(value, (list, tuple)) else int(value)


class Conv1dAsConv2d(Rewrite):
    description = "conv1d -> unsqueeze, conv2d of kernel height 1, squeeze (CMSIS-NN's int8 conv; a following eval batch norm folded in)"
    targets = ("cortex-m33",)

    def apply(self, gm: GraphModule, target: TargetSpec) -> bool:
        import torch

        from etforge.sdk import attribute, call, calls, constant, replace, val

        aten = torch.ops.aten
        changed = False
        for node in calls(gm, aten.conv1d.default):
            x, w_node, *rest = node.args
            bias_node, stride, padding, dilation, groups = (*rest, *_DEFAULTS[len(rest) :])
            xv, w = val(x), attribute(gm, w_node)
            b = attribute(gm, bias_node) if bias_node is not None else None
            if xv is None or xv.dim() != 3 or w is None or isinstance(padding, str):
                continue
            if bias_node is not None and b is None:
                continue
            weights, bias = w.detach(), b.detach() if b is not None else None
            replaced = node
            bn = batch_norm_after(gm, node)
            if bn is not None:
                replaced, scale, shift = bn
                weights = (weights.double() * scale.double().reshape(-1, 1, 1)).to(w.dtype)
                base = bias.double() if bias is not None else torch.zeros(w.shape[0], dtype=torch.float64)
                bias = (base * scale.double() + shift.double()).to(w.dtype)
            w4 = constant(gm, weights.unsqueeze(2).contiguous(), f"{w_node.name}_2d", node)
            b4 = constant(gm, bias.contiguous(), f"{w_node.name}_bias_2d", node) if bias is not None else None
            x4 = call(gm, aten.unsqueeze.default, (x, 2), node)
            # CMSIS-NN's convolutions read NHWC: the quantizer takes a conv on channels-last input only
            x4 = call(gm, aten.clone.default, (x4,), node, kwargs={"memory_format": torch.channels_last})
            y4 = call(
                gm,
                aten.conv2d.default,
                (x4, w4, b4, [1, _one(stride)], [0, _one(padding)], [1, _one(dilation)], int(groups)),
                node,
            )
            replace(gm, replaced, call(gm, aten.squeeze.dims, (y4, [2]), node))
            changed = True
        return changed
