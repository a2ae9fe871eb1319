"""Small, torch-level helpers shared by the partitioner, converters and quantizer."""

from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Collection
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.fx import Node

QUANTIZE_OPS = frozenset(
    {
        "quantized_decomposed.quantize_per_tensor.default",
        "quantized_decomposed.quantize_per_tensor.tensor",
    }
)
DEQUANTIZE_OPS = frozenset(
    {
        "quantized_decomposed.dequantize_per_tensor.default",
        "quantized_decomposed.dequantize_per_tensor.tensor",
        "quantized_decomposed.dequantize_per_channel.default",
    }
)


def op_name(target: Any) -> str:
    """Canonical 'namespace.op.overload' string of an ATen or Edge op target (formatted once
    per target: a target's name never changes, and passes ask it of every node)."""
    try:
        return _cached_op_name(target)
    except TypeError:  # an unhashable target
        return _format_op_name(target)


def _format_op_name(target: Any) -> str:
    name = getattr(target, "__name__", None)
    if type(target).__name__ == "EdgeOpOverload" and isinstance(name, str):
        return name
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    if isinstance(name, str):
        module = getattr(target, "__module__", "") or ""
        return f"operator.{name}" if module in {"_operator", "operator"} else name
    return str(target)


_cached_op_name = functools.lru_cache(maxsize=4096)(_format_op_name)


def node_op(node: Node) -> str:
    return op_name(node.target) if node.op == "call_function" else node.op


def is_quantize(node: object) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and node_op(node) in QUANTIZE_OPS


def is_dequantize(node: object) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and node_op(node) in DEQUANTIZE_OPS


def tensor_meta(node: object) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, Node) else None
    return val if isinstance(val, torch.Tensor) else None


def dim_order(node: object) -> tuple[int, ...]:
    """The ExecuTorch dim order of ``node``'s tensor (how the runtime lays it out in memory).

    Computed the way ExecuTorch's emitter computes it, so an NPU partition's I/O layout and
    the ``.pte``'s tensor metadata agree byte for byte (ambiguous strides included).
    """
    from executorch.exir.tensor import dim_order_from_stride

    val = tensor_meta(node)
    if val is None:
        raise ValueError(f"node {node} has no tensor shape")
    return tuple(int(d) for d in dim_order_from_stride(tuple(val.stride())))


def shape_of(node: object) -> tuple[int, ...]:
    val = tensor_meta(node)
    if val is None:
        raise ValueError(f"node {node} has no tensor shape")
    return tuple(int(d) for d in val.shape)


def tensor_inputs(node: Node) -> list[Node]:
    return [a for a in node.all_input_nodes if tensor_meta(a) is not None]


#: Node meta key: the node moves int8 codes between a dequantize and a quantize (see
#: :func:`mark_moved_codes`).
MOVED_CODES_KEY = "etforge_moved_codes"


def _moved(node: Node) -> bool:
    return bool(node.meta.get(MOVED_CODES_KEY))


def node_dtype(node: Node) -> str:
    """'int8' for a node computing on quantized values (Q/DQ around it, possibly through
    marked data movement: :func:`mark_moved_codes`), else its float dtype."""
    if _moved(node) or any(is_dequantize(a) or _moved(a) for a in tensor_inputs(node)):
        return "int8"
    if node.users and all(is_quantize(u) or _moved(u) for u in node.users):
        return "int8"
    val = tensor_meta(node)
    if val is None and node.users:
        # multi-output op (e.g. max_pool2d_with_indices): judge by its first getitem
        first = next(iter(node.users))
        return node_dtype(first) if tensor_meta(first) is not None else "unknown"
    if val is None:
        return "unknown"
    return str(val.dtype).removeprefix("torch.")


def mark_moved_codes(graph: Any, moves: Collection[str]) -> None:
    """Mark the nodes of ops in ``moves`` (converters' ``moves_codes``) that carry int8 codes:
    fed, through such nodes, by a dequantize, or feeding, through such nodes, only quantizes.

    A decomposition after quantization (``matmul`` -> expand, clone, view, bmm, view) puts
    several moves between a dequantize and its consumer; PT2E gave them no Q/DQ of their
    own, yet on the codes they compute the same codes. One tensor input, same dtype in and
    out (a dtype cast is no move)."""

    def is_move(n: Node) -> bool:
        if n.op != "call_function" or node_op(n) not in moves or len(tensor_inputs(n)) != 1:
            return False
        a, v = tensor_meta(tensor_inputs(n)[0]), tensor_meta(n)
        return a is not None and v is not None and a.dtype == v.dtype and v.is_floating_point()

    nodes = list(graph.nodes)
    for n in nodes:
        n.meta.pop(MOVED_CODES_KEY, None)
    for n in nodes:  # forward: from a dequantize
        if is_move(n):
            src = tensor_inputs(n)[0]
            if is_dequantize(src) or _moved(src):
                n.meta[MOVED_CODES_KEY] = True
    for n in reversed(nodes):  # backward: to quantizes only
        if is_move(n) and n.users and all(is_quantize(u) or _moved(u) for u in n.users):
            n.meta[MOVED_CODES_KEY] = True


def quantize_through_moves(node: Node) -> Node | None:
    """The first quantize node reached from ``node``'s output through marked moves only
    (None unless every path ends in one)."""
    users = list(node.users)
    if not users:
        return None
    found = None
    for u in users:
        q = u if is_quantize(u) else quantize_through_moves(u) if _moved(u) else None
        if q is None:
            return None
        found = found or q
    return found


CONSTANT_KEY = "etforge_constant"


def mark_constants(ep: object, folds: Collection[str] = ()) -> None:
    """Flag lifted parameters/buffers/constants so support checks can tell them from inputs,
    and (in graph order) the ``folds`` ops -- those a converter computes at compile time -- of
    a constant (``OpConverter.folds``)."""
    sig = ep.graph_signature  # type: ignore[attr-defined]
    names = (
        set(sig.inputs_to_parameters)
        | set(sig.inputs_to_buffers)
        | set(sig.inputs_to_lifted_tensor_constants)
    )
    for node in ep.graph_module.graph.nodes:  # type: ignore[attr-defined]
        if node.op == "placeholder" and node.target in names:
            node.meta[CONSTANT_KEY] = True
        elif (
            folds
            and node.op == "call_function"
            and node_op(node) in folds
            and node.args
            and is_constant(node.args[0])
        ):
            node.meta[CONSTANT_KEY] = True


def is_constant(arg: object) -> bool:
    """A compile-time tensor: a lifted constant, a dequantize of one, or an op a converter folds
    (marked by :func:`mark_constants`)."""
    if is_dequantize(arg):
        return is_constant(arg.args[0])  # type: ignore[union-attr]
    return isinstance(arg, Node) and (arg.op == "get_attr" or bool(arg.meta.get(CONSTANT_KEY)))


def sync_output_specs(ep: ExportedProgram) -> None:
    """Output specs name the nodes they return: a pass that replaced an output node (a
    decomposition, an inlined block) leaves them naming the old one."""
    (out,) = (n for n in ep.graph_module.graph.nodes if n.op == "output")
    values = torch.utils._pytree.tree_leaves(out.args[0])
    for spec, value in zip(ep.graph_signature.output_specs, values, strict=False):
        name = getattr(spec.arg, "name", None)
        if isinstance(value, Node) and name is not None and name != value.name:
            spec.arg = dataclasses.replace(spec.arg, name=value.name)


def clone_program(ep: ExportedProgram) -> ExportedProgram:
    """A structural copy (new graph, shared tensors) to edit without touching the caller's program:
    the front end rewrites in place, ``to_executorch`` rewrites graphs in place, and the lowered
    Edge program must stay runnable on the host for ``verify``."""
    graph = torch.fx.Graph()
    copies: dict[Node, Node] = {}
    graph.output(graph.graph_copy(ep.graph_module.graph, copies))
    gm = torch.fx.GraphModule(ep.graph_module, graph)
    signature = copy.deepcopy(ep.graph_signature)
    renamed = {old.name: new.name for old, new in copies.items() if old.name != new.name}
    for spec in (*signature.input_specs, *signature.output_specs):
        name = getattr(spec.arg, "name", None)
        if name in renamed:  # the copy avoids Python builtins as names ("input" -> "input_1")
            spec.arg = dataclasses.replace(spec.arg, name=renamed[name])
    return ExportedProgram(
        root=gm,
        graph=gm.graph,
        graph_signature=signature,
        # new dicts, shared tensors: a pass that drops an entry (ExecuTorch's constant
        # folding, the unused-parameter pass) must not drop it from the caller's program
        state_dict=dict(ep.state_dict),
        range_constraints=ep.range_constraints,
        module_call_graph=copy.deepcopy(ep.module_call_graph),
        example_inputs=ep.example_inputs,
        constants=dict(ep.constants),
        verifiers=[ep.verifier],
    )
