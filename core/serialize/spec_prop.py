"""``to_executorch``'s spec propagation without its re-trace where the graph was just re-traced.

ExecuTorch's ``SpecPropPass`` first re-traces the whole graph with fake tensors (only to bring
each node's ``val`` up to date), then gives every node a ``TensorSpec`` from its ``val``. In
``to_executorch`` it runs right after ``LegalizePortableDimOrderPass``, an ``ExportPass`` that
re-traces the whole graph itself: the graph SpecPropPass receives is a re-trace's output, and
re-tracing that gives the same graph (the premise ``plugins/targets/cortex_m_passes.py`` and
``core/lower/edge_passes.py`` already rest on). So its re-trace is left out there and the specs
are written on the graph as received: 0.1 s of CPU on resnet18, the ``.pte`` byte-identical.
Anywhere else (another pass before it, a pass with its own ``call``) it runs as ExecuTorch runs
it. ``SKIP`` set to False runs ExecuTorch's own pass (the reference, for tests).
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Iterator
from typing import Any

import torch
from executorch.exir.delegate import executorch_call_delegate
from executorch.exir.pass_base import ExportPass
from executorch.exir.passes.spec_prop_pass import SpecPropPass, make_spec
from torch.fx.passes.infra.pass_base import PassBase, PassResult
from torch.utils import _pytree as pytree

from etforge.core.common.scoped_patch import ScopedPatch

#: False: ExecuTorch's own SpecPropPass everywhere (the reference, for tests).
SKIP = True

#: How many times the last ``to_executorch`` in this process left the re-trace out (tests).
last_skipped: list[int] = [0]


def always_retraces(p: object) -> bool:
    """Is ``p`` an ``ExportPass`` whose run is ExportPass's own re-trace of the whole graph
    (it only overrides how each node is rewritten, not ``call`` or ``__call__``)?"""
    cls = type(p)
    return (
        isinstance(p, ExportPass)
        and cls.call is ExportPass.call
        and cls.__call__ in (ExportPass.__call__, PassBase.__call__)
        and cls.requires is PassBase.requires
        and cls.ensures is PassBase.ensures
    )


class SpecsOfFreshTrace(SpecPropPass):
    """``SpecPropPass`` on a graph a re-trace just produced: the specs, no re-trace."""

    def __call__(self, graph_module: torch.fx.GraphModule) -> PassResult:
        for module in graph_module.modules():
            if isinstance(module, torch.fx.GraphModule):
                for node in module.graph.nodes:
                    _set_spec(node)
        last_skipped[0] += 1
        return PassResult(graph_module, True)


def _spec_of(value: Any) -> Any:
    return value.meta.get("spec") if isinstance(value, torch.fx.Node) else None


def _set_spec(node: torch.fx.Node) -> None:
    """The spec SpecPropPass gives ``node``: an output's its values' specs, a getitem its
    tuple's element, a delegate call keeps one it was given, every other node its ``val``'s."""
    val = node.meta.get("val")
    if node.op == "output":
        node.meta["spec"] = pytree.tree_map(_spec_of, node.args[0])
    elif node.op == "call_function" and node.target is operator.getitem:
        node.meta["spec"] = pytree.tree_map(_spec_of, node.args[0])[node.args[1]]
    elif node.op == "call_function" and _keeps_spec(node.target):
        if "spec" not in node.meta:
            node.meta["spec"] = pytree.tree_map(make_spec, val)
    else:
        node.meta["spec"] = pytree.tree_map(make_spec, val)


def _keeps_spec(target: Any) -> bool:
    """Targets whose given spec SpecPropPass keeps: the delegate call (and llama's fallback op,
    when that extension is installed)."""
    from executorch.exir.passes import spec_prop_pass

    return target is executorch_call_delegate or (
        target is not None and target is getattr(spec_prop_pass, "_llama_fallback_default", None)
    )


def fresh_specs(passes: list[Any]) -> list[Any]:
    """``passes`` (``edge_to_executorch_passes``'s list) with ``SpecPropPass`` replaced by
    :class:`SpecsOfFreshTrace` where the pass before it always re-traces the graph."""
    if not SKIP:
        return passes
    out = list(passes)
    for i, p in enumerate(out):
        if type(p) is SpecPropPass and i > 0 and always_retraces(out[i - 1]):
            out[i] = SpecsOfFreshTrace()
    return out


def _set_list(fn: Any) -> None:
    from executorch.exir.program import _program

    _program.edge_to_executorch_passes = fn


def _passes_with_fresh_specs(*args: Any, **kwargs: Any) -> list[Any]:
    return fresh_specs(_ORIGINAL(*args, **kwargs))


def _original() -> Any:
    from executorch.exir.program import _program

    return _program.edge_to_executorch_passes


_ORIGINAL = _original()
_PATCH = ScopedPatch(lambda: _set_list(_passes_with_fresh_specs), lambda: _set_list(_ORIGINAL))


@contextlib.contextmanager
def fresh_spec_scope() -> Iterator[None]:
    """``to_executorch`` inside runs :func:`fresh_specs` on its pass list (re-entrant and
    thread-safe: ExecuTorch's own list function is back when the last scope ends)."""
    with _PATCH.scope():
        yield
