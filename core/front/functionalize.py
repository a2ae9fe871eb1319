"""In-place ops (``relu_``, ``add_``, ``x += y``, ``copy_`` …) become their functional forms.

``torch.export`` (the training IR) keeps a model's in-place ops as they are written:
``nn.ReLU(inplace=True)`` is ``aten.relu_``, ``out += identity`` is ``aten.add_``. Quantizer
rules, partition rules and converters match functional ops, CPU kernel libraries have no
out variant of an in-place op, and a node-by-node Edge decomposition cannot take a mutation;
so every program is made functional here, once, before anything else looks at it.

Exactness: an in-place op whose written tensor is a fresh intermediate (no graph input, no
view, no other alias) computes what its functional form computes; it is replaced by that
form, later readers of the written tensor read the new node, and the graph's nodes are
named as ``torch.export`` names them. The program is then the one the model written with
functional ops exports to, node for node (``tests/test_inplace.py`` compares the ``.pte``
bytes). Any other mutation (an input or buffer written, a write through a view) goes
through torch's own functionalization (``ExportedProgram.run_decompositions({})``), which
is exact too but re-traces the program; the caller reports it.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.fx import Graph, Node

from etforge.core.common import fallbacks
from etforge.core.common.errors import first_line
from etforge.core.graph.utils import clone_program


def functionalize(ep: ExportedProgram, owned: bool = True) -> tuple[ExportedProgram, list[str]]:
    """``ep`` with no mutating op, and notes for the user (empty when nothing needed saying).

    ``owned``: ``ep`` is the compile's own (edited in place); else a copy is edited."""
    if not _mutating(ep.graph_module.graph):
        return ep, []
    if not owned:
        ep = clone_program(ep)
    gm = ep.graph_module
    left = []
    for node in _mutating(gm.graph):
        why = _why_not_local(node)
        if why is None:
            _replace(node)
        else:
            left.append(f"{node.name} ({node.target}: {why})")
    if not left:
        _canonical_names(ep)
        gm.recompile()
        return ep, []
    try:
        ep = ep.run_decompositions({})
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0]
        raise torch_error(left, exc, first) from None
    if still := [n.name for n in _mutating(ep.graph_module.graph)]:
        raise torch_error(left, None, f"still mutating after functionalization: {', '.join(still)}")
    return ep, [
        "in-place ops functionalized by re-tracing the program (torch's functionalization): "
        + "; ".join(left[:4])
        + (f" and {len(left) - 4} more" if len(left) > 4 else "")
    ]


def torch_error(left: list[str], exc: Exception | None, detail: str) -> Exception:
    from etforge.core.common.errors import EtforgeError

    kind = f"{type(exc).__name__}: " if exc is not None else ""
    return EtforgeError(f"cannot functionalize in-place op {left[0]}: {kind}{detail}")


def _mutating(graph: Graph) -> list[Node]:
    return [
        n
        for n in graph.nodes
        if n.op == "call_function"
        and isinstance(n.target, torch._ops.OpOverload)
        and n.target._schema.is_mutable
    ]


def functional_form(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """``aten.relu_.default`` -> ``aten.relu.default``: same arguments, nothing written.

    Only ops that write their first argument alone (``Tensor(a!) self``) and return it."""
    schema = op._schema
    args = schema.arguments
    if not args or not (args[0].alias_info is not None and args[0].alias_info.is_write):
        return None
    if any(a.alias_info is not None and a.alias_info.is_write for a in args[1:]):
        return None
    name = schema.name.split("::")[-1]
    if not name.endswith("_") or name.endswith("__"):
        return None
    packet = getattr(getattr(torch.ops, op.namespace), name[:-1], None)
    overload = op._overloadname
    functional = getattr(packet, overload, None) if packet is not None else None
    if not isinstance(functional, torch._ops.OpOverload) or functional._schema.is_mutable:
        return None
    fargs = functional._schema.arguments
    if [str(a.type) for a in fargs] != [str(a.type) for a in args] or [
        a.name for a in fargs if a.kwarg_only
    ] != [a.name for a in args if a.kwarg_only]:
        return None  # (dropout_ names its first argument self, dropout input: positional, same)
    return functional


def _aliases(node: Node) -> bool:
    """Whether ``node``'s output may share storage with one of its inputs (a view, a write)."""
    if node.op != "call_function":
        return node.op != "get_attr"
    target = node.target
    if target is operator.getitem:
        return _aliases(node.args[0]) if isinstance(node.args[0], Node) else True
    if not isinstance(target, torch._ops.OpOverload):
        return True
    return any(r.alias_info is not None for r in target._schema.returns)


def _aliased_input(node: Node) -> Node | None:
    """The input a view (or an in-place op) shares memory with: its first argument."""
    first = node.args[0] if node.args else None
    return first if isinstance(first, Node) else None


def _alias_class(written: Node, writer: Node) -> tuple[Node | None, list[Node]]:
    """The fresh tensor ``written`` is a view of (``None``: unknown) and every node sharing its
    memory, except through ``writer`` (whose readers read the written value, as they should)."""
    root = written
    while root.op == "call_function" and _aliases(root):
        up = _aliased_input(root)
        if up is None:
            return None, []
        root = up
    if root.op not in ("call_function", "placeholder", "get_attr"):
        return None, []
    members, todo = [root], [root]
    while todo:
        for user in todo.pop().users:
            if (
                user is not writer
                and user.op == "call_function"
                and _aliases(user)
                and _aliased_input(user) in members
                and user not in members
            ):
                members.append(user)
                todo.append(user)
    return root, members


def _why_not_local(node: Node) -> str | None:
    """Why replacing ``node`` by its functional form could change what the program computes."""
    functional = functional_form(node.target)
    if functional is None:
        return "no functional form with the same arguments"
    written = node.args[0] if node.args else None
    if not isinstance(written, Node):
        return "writes a keyword argument"
    root, members = _alias_class(written, node)
    if root is None:
        return f"writes {written.name}, a view of something that is not an op's fresh result"
    if root.op in ("placeholder", "get_attr"):
        through = f" (through {written.name})" if root is not written else ""
        return f"writes {root.name}, an input or buffer of the program{through}"
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    for member in members:
        if member is written or member is node:
            continue
        for user in member.users:
            if user is not node and order[user] > order[node]:
                return f"{user.name} reads {member.name}, which shares memory with {written.name}, after the write"
    try:
        new = _value(functional, node)
    except Exception as exc:  # the functional form cannot be evaluated here: torch's path decides
        return f"computing {functional} on its traced inputs failed ({type(exc).__name__}: {first_line(exc)})"
    old = node.meta.get("val")
    if not isinstance(new, torch.Tensor) or not isinstance(old, torch.Tensor):
        return "no tensor value to check the functional form against"
    if new.dtype != old.dtype or tuple(new.shape) != tuple(old.shape):
        return f"the functional form gives {new.dtype}{list(new.shape)}, not {old.dtype}{list(old.shape)}"
    return None


def _value(op: torch._ops.OpOverload, node: Node) -> Any:
    from torch._guards import detect_fake_mode

    args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: a.meta.get("val"))
    fake = detect_fake_mode(
        [v for v in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(v, torch.Tensor)]
    )
    if fake is None:
        return op(*args, **kwargs)
    with fake:
        return op(*args, **kwargs)


def _replace(node: Node) -> None:
    """``node`` computes its functional form; whatever read the written tensor after it reads it."""
    functional = functional_form(node.target)
    assert functional is not None
    written = node.args[0]
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    for user in list(written.users):
        if user is not node and order[user] > order[node]:
            user.replace_input_with(written, node)
    new = _value(functional, node)
    old = node.meta.get("val")
    node.target = functional
    node.meta["val"] = new
    if "original_aten" in node.meta:
        node.meta["original_aten"] = functional
    if isinstance(old, torch.Tensor) and new.stride() != old.stride():
        _refresh_after(node)


def _refresh_after(start: Node) -> None:
    """Recompute ``meta['val']`` of the nodes after ``start`` (its strides changed)."""
    from torch._guards import detect_fake_mode

    graph = start.graph
    vals = [n.meta.get("val") for n in graph.nodes if n.op == "placeholder"]
    fake = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
    seen = False
    for node in graph.nodes:
        if node is start:
            seen = True
            continue
        if not seen or node.op != "call_function":
            continue
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: a.meta.get("val"))
        try:
            if fake is None:
                node.meta["val"] = node.target(*args, **kwargs)
            else:
                with fake:
                    node.meta["val"] = node.target(*args, **kwargs)
        except Exception as exc:  # the node keeps its traced value: said, not hidden
            fallbacks.record(
                "front",
                "kept the traced value (strides) of a node after an in-place op became functional",
                node.name,
                f"recomputing it failed ({type(exc).__name__}: {first_line(exc)})",
            )


def _candidate(node: Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return node.graph._target_to_str(target.overloadpacket.__name__)
    if node.op == "call_function":
        return node.graph._target_to_str(target)
    return node.name


def _canonical_names(ep: ExportedProgram) -> None:
    """Name every node as ``torch.export`` names the program's functional twin: per op, in
    order (``relu``, ``relu_1`` …); placeholders keep their names, the signature follows."""
    from torch.fx.graph import _Namespace

    graph = ep.graph_module.graph
    namespace = _Namespace()
    renamed: dict[str, str] = {}
    for node in graph.nodes:
        if node.op == "placeholder":
            namespace.create_name(node.name, node)
    for node in graph.nodes:
        if node.op == "placeholder":
            continue
        name = namespace.create_name(_candidate(node), node)
        if name != node.name:
            renamed[node.name] = name
            node.name = name
    graph._graph_namespace = namespace
    if not renamed:
        return
    sig = ep.graph_signature
    for spec in sig.output_specs:
        name = getattr(spec.arg, "name", None)
        if name in renamed:
            spec.arg = dataclasses.replace(spec.arg, name=renamed[name])
    for entry in ep.module_call_graph:
        signature = entry.signature
        if signature is None:
            continue
        for i, arg in enumerate(signature.outputs):
            name = getattr(arg, "name", None)
            if name in renamed:
                signature.outputs[i] = dataclasses.replace(arg, name=renamed[name])
