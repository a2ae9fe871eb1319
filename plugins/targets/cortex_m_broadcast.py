"""Channel-broadcast operands stored NHWC before the Cortex-M lowering.

CMSIS-NN's ``quantized_mul`` / ``quantized_add`` broadcast an [N, C, 1, 1] operand over H x W
only when both operands are channels-last (ExecuTorch asserts ``is_channel_broadcast``). The
program is exported channels-last, but a few ops give a contiguous result (a ``slice_copy``
over channels after a ``cat``, for one; ghostnet_100 has such a map), and the lowering then fails on an SE
gate that torchvision's form passes. Such an operand's int8 codes are copied to the
channels-last dim order here (``_to_dim_order_copy``, a portable kernel), before the
lowering; ``dim_orders.align`` checks every kernel's dim orders after it, as for any copy.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from etforge.sdk import is_dequantize, is_quantize, node_op

#: The Edge ops ExecuTorch lowers to CMSIS-NN's broadcasting ``quantized_add`` / ``quantized_mul``.
BROADCASTING = frozenset({"aten.add.Tensor", "aten.mul.Tensor"})


def _val(node: object) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _is_channels_last(t: torch.Tensor) -> bool:
    return t.shape[1] == 1 or (t.shape[2] == 1 and t.shape[3] == 1) or list(t.dim_order()) == [0, 2, 3, 1]


def _channel_broadcast(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``b`` is [N, C, 1, 1] (C > 1) broadcast over ``a``'s H x W."""
    return a.dim() == b.dim() == 4 and a.shape[1] == b.shape[1] and b.numel() == b.shape[1] < a.numel()


def channels_last_broadcasts(ep: ExportedProgram) -> list[str]:
    """Store the big operand of every channel-broadcast add/mul channels-last: a
    ``_to_dim_order_copy`` of its int8 codes, between its quantize and dequantize (the pass
    manager re-traces, so only a node keeps the order); the names of those quantize nodes."""
    from executorch.exir.dialects._ops import ops as exir_ops

    graph = ep.graph_module.graph
    changed: list[str] = []
    for node in list(graph.nodes):
        if node.op != "call_function" or node_op(node) not in BROADCASTING or len(node.args) < 2:
            continue
        a, b = node.args[0], node.args[1]
        va, vb = _val(a), _val(b)
        if va is None or vb is None:
            continue
        if _channel_broadcast(vb, va):
            a, va = b, vb
        elif not _channel_broadcast(va, vb):
            continue
        if _is_channels_last(va) or not is_dequantize(a) or not is_quantize(a.args[0]):
            continue
        q = a.args[0]
        with graph.inserting_after(q):
            copy = graph.call_function(
                exir_ops.edge.dim_order_ops._to_dim_order_copy.default, (q,), {"dim_order": [0, 2, 3, 1]}
            )
        # No provenance: the copy is no op of the quantized program (verify pairs ops by it)
        copy.meta["val"] = q.meta["val"].contiguous(memory_format=torch.channels_last)
        a.replace_input_with(q, copy)
        changed.append(q.name)
    if changed:
        ep.graph_module.recompile()
    return changed
