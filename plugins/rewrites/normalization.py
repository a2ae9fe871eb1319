"""Normalizations in the forms the NPU and the CPU kernel libraries run.

LayerNorm as mean, sub, mul, rsqrt, add: LiteRT has no LayerNorm builtin; decomposed, each
step is one int8 NPU op with its own quantization (the mean and variance over the normalized
dims keep their dims so the broadcasts stay elementwise).

A BatchNorm in eval mode that does not follow a convolution (DenseNet's BN-ReLU-conv on a
concatenation, a BN after a pooling or at a model's input) is a per-channel affine map with
constants from its running statistics: on a 4-D input a depthwise 1x1 convolution (per-channel
int8 weights, one op the NPU runs and a following ReLU fuses into), otherwise a MUL and an ADD.
Left alone it reaches the lowering as ``native_batch_norm``, which no NPU converter and no CPU
kernel library takes. A BatchNorm after a convolution is PT2E's to fold into the weights.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING

from etforge.sdk import Rewrite, hookimpl, replace

if TYPE_CHECKING:
    from torch.fx import GraphModule, Node

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
            replace(gm, node, out)
            changed = True
        return changed


#: Ops whose output PT2E folds a following BatchNorm into (``_fuse_conv_bn_``).
_CONVS = (
    "aten.conv1d.default",
    "aten.conv2d.default",
    "aten.conv3d.default",
    "aten.conv1d.padding",
    "aten.conv2d.padding",
    "aten.conv_transpose1d.default",
    "aten.conv_transpose2d.input",
    "aten.convolution.default",
)


class StandaloneBatchNorm(Rewrite):
    description = (
        "eval batch_norm not after a convolution -> its per-channel affine map "
        "(a depthwise 1x1 conv on 4-D inputs, else mul + add)"
    )

    def apply(self, gm: GraphModule, target: TargetSpec) -> bool:
        import torch

        from etforge.sdk import batch_norm_affine, call, calls, constant, val

        aten = torch.ops.aten
        changed = False
        for node in calls(gm, aten.batch_norm.default, aten._native_batch_norm_legit_no_training.default):
            x = node.args[0]
            v = val(x)
            if v is None or not v.is_floating_point() or v.dim() < 2 or _after_conv(x) or _after_linear(x):
                continue
            affine = batch_norm_affine(gm, node)
            if affine is None or not _only_output_used(node):
                continue
            scale, shift = (t.to(v.dtype) for t in affine)
            c = v.shape[1]
            if v.dim() == 4:
                w = constant(gm, scale.reshape(c, 1, 1, 1), "bn_weight", node)
                b = constant(gm, shift, "bn_bias", node)
                out = call(gm, aten.conv2d.default, (x, w, b, [1, 1], [0, 0], [1, 1], c), node)
            else:
                per_channel = (c,) + (1,) * (v.dim() - 2)
                out = call(
                    gm, aten.mul.Tensor, (x, constant(gm, scale.reshape(per_channel), "bn_scale", node)), node
                )
                out = call(
                    gm,
                    aten.add.Tensor,
                    (out, constant(gm, shift.reshape(per_channel), "bn_shift", node)),
                    node,
                )
            if node.target is aten.batch_norm.default:
                replace(gm, node, out)
            else:
                for u in list(node.users):
                    replace(gm, u, out)
            changed = True
        return changed


def _only_output_used(bn: Node) -> bool:
    """``batch_norm`` returns its output; the ``_native_batch_norm_legit_no_training`` triple
    (output, save_mean, save_invstd) may be replaced only if just the output is read."""
    import torch

    if bn.target is not torch.ops.aten._native_batch_norm_legit_no_training.default:
        return True
    return all(u.target is operator.getitem and u.args[1] == 0 for u in bn.users if u.users)


def _after_linear(x: object) -> bool:
    """``x`` is a linear on a 2-D input: PT2E folds the BatchNorm after it into its weights
    (torchao's ``_fuse_linear_bn_``), as it folds one after a conv. Rewritten here, it would
    stay a float mul + add (zoo:autoencoder on cortex-m33: 599,950 -> 1,337,850 instructions)."""
    import torch

    if getattr(x, "op", None) != "call_function" or x.target is not torch.ops.aten.linear.default:  # type: ignore[attr-defined]
        return False
    v = getattr(x.args[0], "meta", {}).get("val")  # type: ignore[attr-defined]
    return v is not None and v.dim() == 2


def _after_conv(x: object) -> bool:
    from etforge.sdk import node_op

    return getattr(x, "op", None) == "call_function" and node_op(x) in _CONVS


@hookimpl
def etforge_rewrites() -> list[Rewrite]:
    return [LayerNorm(), StandaloneBatchNorm()]
