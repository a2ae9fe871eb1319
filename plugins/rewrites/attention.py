"""``F.scaled_dot_product_attention`` spelt as the ops it computes: two matmuls and a softmax.

Left whole, SDPA reaches ``to_edge`` as one op whose decomposition guards against fully
masked rows (``eq`` / ``logical_not`` / ``any`` / ``where`` / ``full_like``) and scales with a
``mul.Scalar``; no converter takes those, so the attention stays float on the CPU (41.5 % of an
encoder block's MACs on the NPU). Without a mask no row can be fully masked, the guard is the
identity, and ``softmax(q @ kᵀ / √E) @ v`` is the whole computation, which the NPU runs as
BATCH_MATMUL, SOFTMAX and BATCH_MATMUL, each quantized by the existing rules. Causal
attention, dropout, grouped-query heads and masks are left to the decomposition, except a mask
computed from constants alone that masks nothing.
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
            if any(t is None or not t.is_floating_point() for t in tensors) or not _plain(node, val):
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


def _plain(node: Node, val: Any) -> bool:
    """No mask (or one that masks nothing), no dropout, not causal, no grouped-query heads."""
    given: dict[str, Any] = dict(zip(_ORDER, node.args[3:], strict=False))
    given.update({k: v for k, v in node.kwargs.items() if k != "scale"})
    if _masks_nothing(given.get("attn_mask"), val):
        given["attn_mask"] = None
    return all(given.get(name, default) == default for name, default in _PLAIN.items()) and set(given) <= set(
        _PLAIN
    )


def _masks_nothing(mask: Any, val: Any) -> bool:
    """A mask computed from constants alone that adds nothing (float zeros) or keeps every
    position (bool True): Hugging Face's encoders exported without a padding mask build one
    from ``torch.ones``, and the decomposition's fully-masked-row guard kept the attention
    float on the CPU."""
    import torch

    value = val(mask)
    if value is None or _reads_an_input(mask):
        return False
    if value.dtype == torch.bool:
        return bool(value.all())
    return value.is_floating_point() and not bool(value.any())


def _reads_an_input(node: Node) -> bool:
    seen, pending = set(), [node]
    while pending:
        n = pending.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "placeholder":
            return True
        pending.extend(n.all_input_nodes)
    return False


@hookimpl
def etforge_rewrites() -> list[Rewrite]:
    return [ScaledDotProductAttention()]
