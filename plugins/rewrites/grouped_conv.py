"""Grouped convolutions as single-group convolutions and a concatenation.

The Neutron NPU runs regular and depthwise convolutions; ExecuTorch's NXP backend splits a
grouped convolution with 2 to 10 groups (not depthwise) into one convolution per group on a
channel slice of the input, concatenated (``aten_passes/split_group_convolution.py``; 10 is
NXP's empirical bound on the branches worth creating) and hands other grouped convolutions to
the NPU as they are. etforge does the same with its own rewrite, driven by the target's data:
``requires`` ``conv_plain_or_depthwise`` switches it on, ``limits["max_split_groups"]`` is the
bound. A batch norm that follows the convolution (eval mode, constant statistics) is folded
into each branch's weights first -- after the split it would follow the concatenation, where
nothing fuses it and it would stay on the CPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from etforge.sdk import Rewrite, batch_norm_after, hookimpl, replace

if TYPE_CHECKING:
    from torch.fx import GraphModule

    from etforge.sdk import TargetSpec

#: ``aten.conv2d`` / ``aten.conv1d`` argument defaults after the weight.
_DEFAULTS = (None, 1, 0, 1, 1)


class SplitGroupedConv(Rewrite):
    description = (
        "grouped conv (2 <= groups <= npu max_split_groups, not depthwise) -> one conv per group "
        "on a channel slice, then cat (a following eval batch norm folded in)"
    )
    npu_only = True

    def apply(self, gm: GraphModule, target: TargetSpec) -> bool:
        import torch

        from etforge.sdk import attribute, call, calls, constant, val

        npu = target.npu
        if (
            npu is None
            or not npu.requirement("conv_plain_or_depthwise")
            or "max_split_groups" not in npu.limits
        ):
            return False
        aten = torch.ops.aten
        changed = False
        for node in calls(gm, aten.conv2d.default, aten.conv1d.default):
            x, w_node, *rest = node.args
            bias_node, stride, padding, dilation, groups = (*rest, *_DEFAULTS[len(rest) :])
            xv, w = val(x), attribute(gm, w_node)
            b = attribute(gm, bias_node) if bias_node is not None else None
            if xv is None or w is None or (bias_node is not None and b is None) or isinstance(padding, str):
                continue
            c_in, c_out = xv.shape[1], w.shape[0]
            groups = int(groups)
            if not 2 <= groups <= npu.limits["max_split_groups"] or c_in == c_out == groups:
                continue
            weights = w.detach().double()
            bias = b.detach().double() if b is not None else torch.zeros(c_out, dtype=torch.float64)
            replaced = node
            bn = batch_norm_after(gm, node)
            if bn is not None:
                replaced, scale, shift = bn
                weights = weights * scale.reshape(-1, *[1] * (weights.dim() - 1))
                bias = bias * scale + shift
            cin_g, cout_g = c_in // groups, c_out // groups
            branches = []
            for g in range(groups):
                part = call(gm, aten.slice.Tensor, (x, 1, g * cin_g, (g + 1) * cin_g), node)
                sl = slice(g * cout_g, (g + 1) * cout_g)
                wg = constant(gm, weights[sl].to(w.dtype).contiguous(), f"{w_node.name}_g{g}", node)
                bg = constant(gm, bias[sl].to(w.dtype).contiguous(), f"{w_node.name}_bias_g{g}", node)
                branches.append(call(gm, node.target, (part, wg, bg, stride, padding, dilation, 1), node))
            out = call(gm, aten.cat.default, (branches, 1), node)
            replace(gm, replaced, out)
            changed = True
        return changed


@hookimpl
def etforge_rewrites() -> list[Rewrite]:
    return [SplitGroupedConv()]
