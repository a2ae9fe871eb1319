"""Float ops left on the CPU of a quantized program: each one a recorded fallback.

A quantized compile promises int8 arithmetic. An op the CPU quantizer gives no int8 form runs
as dequantize, float op, quantize on a float kernel: slower (tens of times on a Cortex-M
without an FPU fast path) and not what the user asked for. The lowering never refuses it, so
it is told here, once per Edge op kind, naming every node (``report.json`` ``fallbacks``;
``--no-fallback`` refuses it). The report marks the same nodes (``float``: true).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch.export import ExportedProgram
from torch.fx import Node

from etforge.core.common import fallbacks
from etforge.core.graph.utils import node_op, tensor_meta

#: call_function nodes that compute nothing themselves (delegates, their outputs, planned buffers).
_STRUCTURAL = ("executorch_call_delegate", "getitem", "alloc", "memory.alloc")


def _qdq(op: str) -> bool:
    parts = op.split(".")
    return len(parts) >= 2 and parts[1].startswith(("quantize_per_", "dequantize_per_"))


def _constant_inputs(ep: ExportedProgram) -> set[str]:
    sig = ep.graph_signature
    return {
        *sig.inputs_to_parameters,
        *sig.inputs_to_buffers,
        *getattr(sig, "inputs_to_lifted_tensor_constants", {}),
    }


def float_nodes(ep: ExportedProgram) -> list[Node]:
    """The compute nodes of ``ep`` that produce a float tensor from a float tensor computed at
    run time (not a weight): the float arithmetic of the program. Quantize and dequantize
    nodes convert and are not counted; nor are delegates and planned buffers."""
    constants = _constant_inputs(ep)
    out = []
    for node in ep.graph_module.graph.nodes:
        if (
            node.op == "call_function"
            and node.all_input_nodes
            and all(a.name in constants for a in node.all_input_nodes)
        ):
            constants.add(node.name)  # computed from weights alone (a weight's dequantize, a transpose of it)
            continue
        if node.op != "call_function":
            continue
        op = node_op(node)
        if _qdq(op) or any(s in op for s in _STRUCTURAL):
            continue
        val = tensor_meta(node)
        if val is None or not val.dtype.is_floating_point:
            continue
        if any(_runtime_float(a, constants) for a in node.all_input_nodes):
            out.append(node)
    return out


def _runtime_float(arg: Node, constants: set[str]) -> bool:
    if arg.op == "placeholder" and arg.name in constants:
        return False
    if arg.op == "get_attr":
        return False
    val = tensor_meta(arg)
    return val is not None and val.dtype.is_floating_point


def by_edge_node(ep: ExportedProgram, decisions: Iterable[Any]) -> dict[str, list[str]]:
    """Edge node name (the report's row) -> the float CPU ops that run it: the node of the
    same name, else the one its debug handle names. A node the CPU lowering inserted without
    a handle (a layout copy around a float op) is not a row of its own: the op it serves is."""
    decisions = list(decisions)
    names = {d.node for d in decisions}
    rows = {d.handle: d.node for d in decisions if getattr(d, "handle", None) is not None}
    out: dict[str, list[str]] = {}
    for node in float_nodes(ep):
        name = node.name if node.name in names else rows.get(node.meta.get("debug_handle"))
        if name is None:
            continue
        ops = out.setdefault(name, [])
        if node_op(node) not in ops:
            ops.append(node_op(node))
    return out


def record(ep: ExportedProgram, decisions: list[Any], target: str, backend: str) -> dict[str, list[str]]:
    """Record one fallback per Edge op kind that runs in float on the CPU (every node named);
    returns :func:`by_edge_node` for the report."""
    found = by_edge_node(ep, decisions)
    ops_of = {d.node: d.op for d in decisions}
    reason = {d.node: d.reason for d in decisions}
    groups: dict[str, list[str]] = {}
    for name in found:
        groups.setdefault(ops_of.get(name, "?"), []).append(name)
    for op, names in groups.items():
        ran = sorted({o for n in names for o in found[n]})
        refused = sorted({reason[n] for n in names if reason.get(n) and "has no NPU" not in reason[n]})
        why = (
            (f"{'; '.join(refused)}; and " if refused else "")
            + f"the {backend} quantizer gave it no int8 form on {target}, so it runs dequantize, float {', '.join(ran)}, quantize"
        )
        fallbacks.record("quantize", "runs in float on the CPU", f"{op}: {', '.join(names)}", why)
    return found
