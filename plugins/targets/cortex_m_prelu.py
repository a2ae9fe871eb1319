"""PReLU in int8 on the Cortex-M: ``relu(x) + alpha * (x - relu(x))``.

ExecuTorch's Cortex-M lowering has no PReLU: ``to_edge`` decomposes it into a float compare,
``where`` and multiply between dequantize and quantize (face detectors in the MTCNN style
are conv, PReLU, ceil-mode pool). The same function spelt with ops its quantizer and
CMSIS-NN kernels take — a ReLU, a subtraction, a per-channel multiply (a channel broadcast
on channels-last tensors) and an addition — runs int8 end to end; each op requantizes once.
4-D inputs only: CMSIS-NN's multiply broadcasts a per-channel operand only over NHWC.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from etforge.sdk import Rewrite

if TYPE_CHECKING:
    from torch.fx import GraphModule

    from etforge.sdk import TargetSpec


class PReluAsInt8Ops(Rewrite):
    description = (
        "prelu(x, a) on 4-D x -> relu(x) + a * (x - relu(x)) (int8 on CMSIS-NN: relu, sub, "
        "per-channel mul, add)"
    )
    targets = ("cortex-m33",)

    def apply(self, gm: GraphModule, target: TargetSpec) -> bool:
        import torch

        from etforge.sdk import attribute, call, calls, constant, replace, val

        aten = torch.ops.aten
        changed = False
        for node in calls(gm, aten.prelu.default, aten._prelu_kernel.default):
            x, w_node = node.args[:2]
            xv, w = val(x), attribute(gm, w_node)
            if xv is None or xv.dim() != 4 or not xv.is_floating_point() or w is None:
                continue
            c = xv.shape[1]
            if w.numel() not in (1, c):
                continue
            alpha = w.detach().reshape(-1).expand(c).reshape(1, c, 1, 1).contiguous()
            a = constant(gm, alpha.to(xv.dtype), f"{w_node.name}_per_channel", node)
            r = call(gm, aten.relu.default, (x,), node)
            neg = call(gm, aten.sub.Tensor, (x, r), node)  # min(x, 0)
            scaled = call(gm, aten.mul.Tensor, (neg, a), node)
            replace(gm, node, call(gm, aten.add.Tensor, (r, scaled), node))
            changed = True
        return changed
