"""Early delegation: cut NPU partitions from the quantized ATen program, before ``to_edge``.

``to_edge`` re-traces the whole program several times (decompositions, then each Edge pass);
nodes bound for the NPU need none of it. Here each node gets, in place and only where it
needs it, exactly what ``to_edge`` would give it: the Edge decomposition table applied to the
node alone (memoized per signature), view ops as their ``*_copy`` forms, ExecuTorch's
graph-only no-op passes, debug handles. Our partitioner then delegates on that graph, and
``to_edge`` runs on what is left (Q/DQ, CPU ops, delegate calls), with each delegate's
fake-tensor rule served by a shape-only stub while it does (``core/lower/delegate_stubs.py``).

The classic path stays the reference: where this one cannot be exact (a decomposition
that creates constants, a node without provenance), or where the NPU would take a node of
the remainder's Edge form, :func:`lower_early` returns ``None`` and the caller lowers the
classic way. ``tests/test_early.py`` compares the two.
"""

from __future__ import annotations

import contextlib
import operator
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node
from torch.utils import _pytree as pytree

from etforge.core.graph.utils import sync_output_specs


class NotExact(Exception):
    """The early path cannot reproduce ``to_edge`` for this program; lower the classic way."""


def prepare(ep: ExportedProgram, keep: set[Any], table: dict[Any, Callable[..., Any]]) -> None:
    """Give ``ep``'s graph (a private copy) the node forms ``to_edge`` would, in place."""
    _provenance(ep.graph_module)
    decompose(ep, keep, table, recompile=False)
    _scalars_to_tensors(ep.graph_module)
    _graph_only_passes(ep.graph_module)
    ep.graph_module.graph.eliminate_dead_code()
    _lift_constants(ep)
    _debug_handles(ep.graph_module)
    ep.graph_module.recompile()


def decompose(
    ep: ExportedProgram, keep: set[Any], table: dict[Any, Callable[..., Any]], recompile: bool = True
) -> None:
    """Decompose, node by node, every op outside ``keep`` that ``to_edge`` would decompose.

    Also run on what delegation left over: an op kept whole for the NPU that stayed on the
    CPU is decomposed there, as ``to_edge`` does with it."""
    gm = ep.graph_module
    memo: dict[Any, GraphModule] = {}
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and _needs_decomposition(node.target, keep, table):
            _decompose(gm, node, table, memo)
    _views_to_copies(gm)
    sync_output_specs(ep)
    if recompile:
        gm.graph.eliminate_dead_code()
        gm.recompile()


def _needs_decomposition(target: Any, keep: set[Any], table: dict[Any, Any]) -> bool:
    if not isinstance(target, torch._ops.OpOverload) or target in keep:
        return False
    if target in table:
        return True
    if target.namespace != "aten":  # quantization primitives, backends' and users' own ops
        return False
    if torch.Tag.core in target.tags:
        return False
    # A non-core op without a table entry is decomposed by dispatch when it is composite.
    return target.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd)


def _signature(node: Node) -> Any:
    def key(a: Any) -> Any:
        if isinstance(a, Node):
            v = a.meta.get("val")
            if not isinstance(v, torch.Tensor):
                raise NotExact(f"input {a.name} of {node.name} has no tensor value")
            return ("T", tuple(v.shape), tuple(v.stride()), v.dtype)
        return a

    flat, spec = pytree.tree_flatten((node.args, node.kwargs))
    return (node.target, str(spec), tuple(key(a) for a in flat))


def _trace(node: Node, table: dict[Any, Any], contiguous: bool = False) -> GraphModule:
    from torch._guards import detect_fake_mode
    from torch.fx.experimental.proxy_tensor import make_fx

    flat, spec = pytree.tree_flatten((node.args, node.kwargs))
    where = [i for i, a in enumerate(flat) if isinstance(a, Node)]
    values = [flat[i].meta["val"] for i in where]
    if contiguous and values:
        with detect_fake_mode(values) or contextlib.nullcontext():
            values = [v.contiguous() if isinstance(v, torch.Tensor) else v for v in values]

    def call(*tensors: torch.Tensor) -> Any:
        args = list(flat)
        for i, t in zip(where, tensors, strict=True):
            args[i] = t
        a, k = pytree.tree_unflatten(args, spec)
        return node.target(*a, **k)

    # A factory (``torch.ones(...)``: no tensor inputs) traces in the graph's own fake mode,
    # or its values would come from a new one, which ExportedProgram refuses to mix.
    fake = detect_fake_mode(values) if values else _graph_fake_mode(node)
    with fake if fake is not None else contextlib.nullcontext():
        return make_fx(call, decomposition_table=table)(*values)


def _graph_fake_mode(node: Node) -> Any:
    from torch._guards import detect_fake_mode

    vals = [n.meta.get("val") for n in node.graph.nodes if n.op == "placeholder"]
    return detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])


def _mutates(nodes: list[Node]) -> bool:
    return any(isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable for n in nodes)


def _same_layout(sub: GraphModule, node: Node) -> bool:
    """``sub``'s outputs have ``node``'s shapes and strides (on dims of size > 1)."""
    (result,) = (n.args[0] for n in sub.graph.nodes if n.op == "output")
    got = [n.meta.get("val") if isinstance(n, Node) else n for n in pytree.tree_leaves(result)]
    want = pytree.tree_leaves(node.meta.get("val"))
    if len(got) != len(want):
        return False
    for a, b in zip(got, want, strict=True):
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or a.shape != b.shape:
            return False
        if any(n > 1 and x != y for n, x, y in zip(a.shape, a.stride(), b.stride(), strict=True)):
            return False
    return True


def _decompose(gm: GraphModule, node: Node, table: dict[Any, Any], memo: dict[Any, Any]) -> None:
    key = _signature(node)
    if key not in memo:
        memo[key] = _trace(node, table)
    sub = memo[key]
    inner = [n for n in sub.graph.nodes if n.op not in ("placeholder", "output")]
    if len(inner) == 1 and inner[0].target is node.target:
        return  # already in its Edge form
    if any(n.op != "call_function" for n in inner):
        raise NotExact(f"decomposing {node.name} ({node.target}) creates constants")
    if _mutates(inner):
        # e.g. a channels-last adaptive_avg_pool2d restores its strides with as_strided_:
        # to_edge functionalizes that away, a node-by-node decomposition cannot. Values do
        # not depend on strides: traced on contiguous inputs, the decomposition is exact
        # when it then mutates nothing and lays its output out as the node did (a global
        # pool's [N, C, 1, 1] is one layout in either order).
        sub = _trace(node, table, contiguous=True)
        inner = [n for n in sub.graph.nodes if n.op not in ("placeholder", "output")]
        if _mutates(inner) or not _same_layout(sub, node):
            raise NotExact(f"decomposing {node.name} ({node.target}) mutates a tensor")
        memo[key] = sub
    inputs = [a for a in pytree.tree_leaves((node.args, node.kwargs)) if isinstance(a, Node)]
    env: dict[Node, Any] = {}
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    env.update(zip(placeholders, inputs, strict=True))
    graph = gm.graph
    with graph.inserting_before(node):
        for n in inner:
            new = graph.node_copy(n, lambda x: env[x])
            new.meta = {**node.meta, "val": n.meta.get("val")}
            env[n] = new
    (result,) = (n.args[0] for n in sub.graph.nodes if n.op == "output")
    replacement = pytree.tree_map(lambda x: env[x] if isinstance(x, Node) else x, result)
    if isinstance(replacement, Node) and replacement in inputs:
        # A functional op that returns its input (eval dropout): functionalization gives a
        # clone there, and so does to_edge.
        with graph.inserting_before(node):
            replacement = graph.call_function(torch.ops.aten.clone.default, (replacement,))
        replacement.meta = {**node.meta}
    if isinstance(replacement, (list, tuple)):
        getters = [u for u in node.users if u.target is operator.getitem]
        for g in getters:
            g.replace_all_uses_with(replacement[g.args[1]])
            graph.erase_node(g)
        if node.users:
            raise NotExact(f"{node.name}'s tuple output is used whole")
    else:
        node.replace_all_uses_with(replacement)
    graph.erase_node(node)


def _views_to_copies(gm: GraphModule) -> None:
    """View ops become their ``*_copy`` forms, whose results are contiguous: the values (and
    strides) of everything downstream are computed again, as ``to_edge``'s re-trace would."""
    from torch._export.passes.replace_view_ops_with_view_copy_ops_pass import (
        _NON_FUNCTIONAL_OPS_TO_FUNCTIONAL_OPS,
        get_view_copy_of_view_op,
    )

    changed: set[Node] = set()
    for node in gm.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if node.target in _NON_FUNCTIONAL_OPS_TO_FUNCTIONAL_OPS:
            node.target = _NON_FUNCTIONAL_OPS_TO_FUNCTIONAL_OPS[node.target]
            changed.add(node)
        elif (copy := _view_copy(node.target, get_view_copy_of_view_op)) is not None:
            node.target = copy
            changed.add(node)
    _refresh_values(gm, changed)


def _view_copy(target: Any, lookup: Callable[[Any], Any]) -> Any:
    """The ``*_copy`` form of a view op; ``None`` for other ops and for composite views (reshape)
    that have none until they are decomposed."""
    from torch._export.error import InternalError

    try:
        return lookup(target._schema)
    except InternalError:
        return None


def _refresh_values(gm: GraphModule, changed: set[Node]) -> None:
    """Recompute ``meta['val']`` of ``changed`` nodes and of every node reading a changed value."""
    from torch._guards import detect_fake_mode

    if not changed:
        return
    placeholders = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    fake = detect_fake_mode([v for v in placeholders if isinstance(v, torch.Tensor)])
    dirty: set[Node] = set()
    with fake if fake is not None else contextlib.nullcontext():
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            if node not in changed and not any(a in dirty for a in node.all_input_nodes):
                continue
            args, kwargs = pytree.tree_map(
                lambda a: a.meta["val"] if isinstance(a, Node) else a, (node.args, node.kwargs)
            )
            new = node.target(*args, **kwargs)
            old = node.meta.get("val")
            node.meta["val"] = new
            if not (
                isinstance(old, torch.Tensor)
                and isinstance(new, torch.Tensor)
                and old.stride() == new.stride()
                and old.shape == new.shape
            ):
                dirty.add(node)


def _graph_only_passes(gm: GraphModule) -> None:
    """ExecuTorch's Edge passes that edit the graph without re-tracing it."""
    from executorch.exir.passes.fold_redundant_qdq_pass import FoldRedundantDequantizeQuantizePass
    from executorch.exir.passes.remove_noop_pass import RemoveNoopPass, RemoveToCopyPass

    for p in (RemoveNoopPass(), RemoveToCopyPass(), FoldRedundantDequantizeQuantizePass()):
        p.call(gm)
    gm.graph.eliminate_dead_code()


def _provenance(gm: GraphModule) -> None:
    """Each node becomes the newest entry of its own provenance, as ``to_edge``'s re-trace
    makes it: a node straight from ``torch.export`` (no ``from_node``) its own origin, which
    debug handles (one per oldest ancestor) are numbered by; a node a quantizer's transform
    made (an ``avg_pool2d`` from ``adaptive_avg_pool2d``) keeps its ancestors beneath it, so
    the lowered op still names the quantized program's node (verify's forcing reads that)."""
    from torch.fx.traceback import NodeSource, NodeSourceAction

    for node in gm.graph.nodes:
        if node.op not in ("placeholder", "output"):
            node.meta["from_node"] = [NodeSource(node, "etforge.early", NodeSourceAction.CREATE)]


def _debug_handles(gm: GraphModule) -> None:
    from executorch.exir.passes.debug_handle_generator_pass import DebugHandleGeneratorPass

    try:
        DebugHandleGeneratorPass().call(gm)
    except AssertionError as exc:  # a node without provenance: handles would not match
        raise NotExact(str(exc)) from None


def _scalars_to_tensors(gm: GraphModule) -> None:
    """A Python number where the op's schema takes a Tensor becomes a tensor constant, as
    ExecuTorch's ``ScalarToTensorPass`` makes it (``mul.Tensor(x, 0.35)``)."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        schema = node.target._schema.arguments
        args = list(node.args)
        kwargs = dict(node.kwargs)
        changed = False
        for i, arg in enumerate(schema):
            positional = not arg.kwarg_only and i < len(args)
            if not positional and arg.name not in kwargs:
                continue
            value = args[i] if positional else kwargs[arg.name]
            if not isinstance(arg.type, torch.TensorType):
                continue
            if isinstance(value, (bool, int, float)):
                name = f"_etforge_scalar_constant{count}"
                count += 1
                setattr(gm, name, torch.tensor(value))
                with gm.graph.inserting_before(node), warnings.catch_warnings():
                    # a plain tensor attribute, as ScalarToTensorPass makes it: lifted to a
                    # constant right after (_lift_constants); torch warns it is no buffer
                    warnings.filterwarnings("ignore", "Attempted to insert a get_attr Node")
                    const = gm.graph.get_attr(name)
                const.meta = {k: v for k, v in node.meta.items() if k != "val"}
                if positional:
                    args[i] = const
                else:
                    kwargs[arg.name] = const
                changed = True
        if changed:
            node.args, node.kwargs = tuple(args), kwargs


def _lift_constants(ep: ExportedProgram) -> None:
    from executorch.exir.program._program import lift_constant_tensor_pass

    if any(n.op == "get_attr" for n in ep.graph_module.graph.nodes):
        lift_constant_tensor_pass(ep)


def handles_by_ancestor(gm: GraphModule) -> dict[str, int]:
    from executorch.exir.debug_handle_utils import get_greatest_ancestor_node_identifier

    out: dict[str, int] = {}
    for n in gm.graph.nodes:
        if n.op not in ("placeholder", "output") and "debug_handle" in n.meta and "from_node" in n.meta:
            out.setdefault(get_greatest_ancestor_node_identifier(n), n.meta["debug_handle"])
    return out


def renumber(gm: GraphModule, handles: dict[str, int]) -> None:
    """Give the remainder's nodes the handles their ancestors had before delegation.

    ``to_edge`` numbers the remainder afresh from 1, which would collide with the handles
    the delegates' debug maps already use."""
    from executorch.exir.debug_handle_utils import get_greatest_ancestor_node_identifier

    top = max(handles.values(), default=0)
    fresh: dict[str, int] = {}
    for n in gm.graph.nodes:
        if n.op in ("placeholder", "output") or "from_node" not in n.meta:
            continue
        anc = get_greatest_ancestor_node_identifier(n)
        if anc not in handles and anc not in fresh:
            top += 1
            fresh[anc] = top
        n.meta["debug_handle"] = handles.get(anc, fresh.get(anc))
