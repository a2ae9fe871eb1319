"""LayerNorm as mean, sub, mul, rsqrt, add — ops the NPU runs in int8.

LiteRT has no LayerNorm builtin; decomposed, each step is one int8 NPU op with its own
quantization (the mean and variance over the normalized dims keep their dims so the
broadcasts stay elementwise).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from etforge.sdk import Rewrite, hookimpl

if TYPE_CHECKING:
    from torch.fx import GraphModule

    from etforge.sdk import TargetSpec


class LayerNorm(Rewrite):
    description = "layer_norm -> (x - mean) * rsqrt(mean((x - mean)^2) + eps) * weight + bias"

    def apply(self, gm: GraphModule, target: TargetSpec) -> bool:
        import torch

        from etforge.sdk import call, calls, constant, val

        aten = torch.ops.aten
        changed = False
        for node in calls(gm, aten.layer_norm.default):
            x = node.args[0]
            v = val(x)
            if v is None or not v.is_floating_point():
                continue
            shape = list(node.args[1])
            weight = node.args[2] if len(node.args) > 2 else node.kwargs.get("weight")
            bias = node.args[3] if len(node.args) > 3 else node.kwargs.get("bias")
            eps = float(node.args[4]) if len(node.args) > 4 else float(node.kwargs.get("eps", 1e-5))
            dims = list(range(v.dim() - len(shape), v.dim()))
            mean = call(gm, aten.mean.dim, (x, dims, True), node)
            centred = call(gm, aten.sub.Tensor, (x, mean), node)
            squared = call(gm, aten.mul.Tensor, (centred, centred), node)
            var = call(gm, aten.mean.dim, (squared, dims, True), node)
            eps_c = constant(gm, torch.tensor(eps, dtype=v.dtype), "eps", node)
            inv = call(gm, aten.rsqrt.default, (call(gm, aten.add.Tensor, (var, eps_c), node),), node)
            out = call(gm, aten.mul.Tensor, (centred, inv), node)
            if weight is not None:
                out = call(gm, aten.mul.Tensor, (out, weight), node)
            if bias is not None:
                out = call(gm, aten.add.Tensor, (out, bias), node)
            node.replace_all_uses_with(out)
            changed = True
        return changed


@hookimpl
def etforge_rewrites() -> list[Rewrite]:
    return [LayerNorm()]
