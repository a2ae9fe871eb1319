"""``F.scaled_dot_product_attention`` spelt as the ops it computes: two matmuls and a softmax.

Left whole, SDPA reaches ``to_edge`` as one op whose decomposition guards against fully
masked rows (``eq`` / ``logical_not`` / ``any`` / ``where`` / ``full_like``) and scales with a
``mul.Scalar``; no converter takes those, so the attention stays float on the CPU (41.5 % of an
encoder block's MACs on the NPU). Without a mask no row can be fully masked, the guard is the
identity, and ``softmax(q @ kᵀ / √E) @ v`` is the whole computation, which the NPU runs as
BATCH_MATMUL, SOFTMAX and BATCH_MATMUL, each quantized by the existing rules. Masks, causal
attention, dropout and grouped-query heads are left to the decomposition.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from etforge.sdk import Rewrite, hookimpl, replace

if TYPE_CHECKING:
    from torch.fx import GraphModule, Node

    from etforge.sdk import TargetSpec

#: SDPA's arguments after q, k, v, with the values this rewrite takes (schema defaults).
_PLAIN = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False, "enable_gqa": False}
_ORDER = ("attn_mask", "dropout_p", "is_causal")


class ScaledDotProductAttention(Rewrite):
    description = (
        "scaled_dot_product_attention(q, k, v) -> softmax(q @ k^T / sqrt(E)) @ v (no mask, causal or dropout)"
    )
    npu_only = True
    #: Before DivByConstant (order 0), which turns the scale's division into a MUL.
    order = -10

    def apply(self, gm: GraphModule, target: TargetSpec) -> bool:
        import torch

        from etforge.sdk import call, calls, val

        aten = torch.ops.aten
        changed = False
        for node in calls(gm, aten.scaled_dot_product_attention.default):
            q, k, v = node.args[:3]
            tensors = [val(t) for t in (q, k, v)]
            if any(t is None or not t.is_floating_point() for t in tensors) or not _plain(node):
                continue
            scale = node.kwargs.get("scale")
            divisor = math.sqrt(tensors[0].shape[-1]) if scale is None else 1.0 / float(scale)
            keys = call(gm, aten.transpose.int, (k, -2, -1), node)
            scores = call(gm, aten.matmul.default, (q, keys), node)
            scores = call(gm, aten.div.Tensor, (scores, divisor), node)
            weights = call(gm, aten.softmax.int, (scores, -1), node)
            replace(gm, node, call(gm, aten.matmul.default, (weights, v), node))
            gm.graph.erase_node(node)  # SDPA is tagged random (dropout): dead-code removal keeps it
            changed = True
        return changed


def _plain(node: Node) -> bool:
    """No mask, no dropout, not causal, no grouped-query heads (positional or keyword)."""
    given: dict[str, Any] = dict(zip(_ORDER, node.args[3:], strict=False))
    given.update({k: v for k, v in node.kwargs.items() if k != "scale"})
    return all(given.get(name, default) == default for name, default in _PLAIN.items()) and set(given) <= set(
        _PLAIN
    )


@hookimpl
def etforge_rewrites() -> list[Rewrite]:
    return [ScaledDotProductAttention()]
