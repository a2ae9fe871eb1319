"""hardsigmoid(x) = relu6(x + 3) / 6, hardswish(x) = x * hardsigmoid(x) and silu(x) =
x * sigmoid(x), spelt with ops every int8 NPU target converts.

Squeeze-excitation gates (MobileNetV3) close with ``F.hardsigmoid``; LiteRT has no
HARD_SIGMOID, and left alone the op either stays float on the CPU of an int8 model or has
no kernel at all. ADD, RELU6 and MUL are each one int8 NPU op, quantized by the existing
add / hardtanh / mul rules, and each rounds once, as the PT2E reference does. LiteRT's int8
HARD_SWISH approximates in fixed point and lands one step off the reference on ~0.6% of
its values (MobileNetV3 block, default kernels), beyond what ``verify`` accepts of an NPU
op, so hardswish takes the same decomposition.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from etforge.sdk import Rewrite, hookimpl, replace

if TYPE_CHECKING:
    from torch.fx import GraphModule

    from etforge.sdk import TargetSpec


class Hardsigmoid(Rewrite):
    description = "hardsigmoid(x) -> mul(hardtanh(add(x, 3), 0, 6), 1/6); hardswish(x) -> x * that"

    def apply(self, gm: GraphModule, target: TargetSpec) -> bool:
        import torch

        from etforge.sdk import call, calls, constant, val

        aten = torch.ops.aten
        changed = False
        ops = (
            aten.hardsigmoid.default,
            aten.hardsigmoid_.default,
            aten.hardswish.default,
            aten.hardswish_.default,
        )
        for node in calls(gm, *ops):
            x = node.args[0]
            v = val(x)
            if v is None or not v.is_floating_point():
                continue
            three = constant(gm, torch.tensor(3.0, dtype=v.dtype), "three", node)
            sixth = constant(gm, torch.tensor(1.0 / 6.0, dtype=v.dtype), "one_sixth", node)
            shifted = call(gm, aten.add.Tensor, (x, three), node)
            clipped = call(gm, aten.hardtanh.default, (shifted, 0.0, 6.0), node)
            out = call(gm, aten.mul.Tensor, (clipped, sixth), node)
            if node.target in (aten.hardswish.default, aten.hardswish_.default):
                out = call(gm, aten.mul.Tensor, (x, out), node)
            replace(gm, node, out)
            changed = True
        return changed


class Silu(Rewrite):
    """SiLU (swish) as ``x * sigmoid(x)``, before quantization.

    LiteRT has no SiLU. Quantized whole, ``silu`` reaches the NPU decomposed into a LOGISTIC
    whose output nobody quantized (int8 in, float out: a partition LiteRT refuses to load);
    spelt out, the sigmoid gets its fixed int8 output (1/256, -128) and the product its own
    qparams, each one NPU op rounding once, as the PT2E reference does."""

    description = "silu(x) -> mul(x, sigmoid(x))"
    npu_only = True

    def apply(self, gm: GraphModule, target: TargetSpec) -> bool:
        import torch

        from etforge.sdk import call, calls, val

        aten = torch.ops.aten
        changed = False
        for node in calls(gm, aten.silu.default, aten.silu_.default):
            x = node.args[0]
            v = val(x)
            if v is None or not v.is_floating_point():
                continue
            gate = call(gm, aten.sigmoid.default, (x,), node)
            replace(gm, node, call(gm, aten.mul.Tensor, (x, gate), node))
            changed = True
        return changed


@hookimpl
def etforge_rewrites() -> list[Rewrite]:
    return [Hardsigmoid(), Silu()]
