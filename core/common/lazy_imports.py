"""Imports the ``etforge`` command defers until something uses them.

``executorch.exir`` imports ``torch.export._remove_auto_functionalized_pass`` for a pass that
only programs with mutating custom ops need, and that module imports Inductor's post-grad
passes for one function: about 1 s and 26 MB (Inductor's lowering tables) on every compile.
:func:`defer_inductor_post_grad` puts a stand-in module in its place whose
``decompose_auto_functionalized`` imports the real module when a graph has something for it
(ExecuTorch calls it on every program; a graph without those ops it would only lint), as
does any other attribute read. Only the command calls it (the library never changes ``sys.modules``
under its host program); with a torch that lacks the module, or has already imported it, it
does nothing.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from typing import Any

POST_GRAD = "torch._inductor.fx_passes.post_grad"


class _Deferred(types.ModuleType):
    """Stands in for a module until an attribute of it is read."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(_load(self.__name__), name)


def _load(name: str) -> types.ModuleType:
    held = sys.modules.get(name)
    if isinstance(held, _Deferred):
        del sys.modules[name]
        parent, _, child = name.rpartition(".")
        if getattr(sys.modules.get(parent), child, None) is held:
            delattr(sys.modules[parent], child)
    return importlib.import_module(name)


#: The higher-order ops ``decompose_auto_functionalized`` rewrites.
_HOPS = frozenset({"auto_functionalized", "auto_functionalized_v2", "control_deps"})


def _nothing_to_decompose(graph: Any) -> bool:
    """Where the real pass would only lint: no op it rewrites, no unused ``get_attr`` it erases."""
    import torch

    for n in graph.nodes:
        if n.op == "get_attr" and not n.users:
            return False
        if (
            n.op == "call_function"
            and isinstance(n.target, torch._ops.HigherOrderOperator)
            and n.target.name() in _HOPS
        ):
            return False
    return True


def _decompose_auto_functionalized(graph: Any) -> Any:
    """ExecuTorch calls it on every program; most have nothing for it and never load it."""
    if _nothing_to_decompose(graph):
        return None
    return _load(POST_GRAD).decompose_auto_functionalized(graph)


def defer_inductor_post_grad() -> bool:
    """Defer Inductor's post-grad passes; True when the stand-in is in place."""
    if POST_GRAD in sys.modules:
        return isinstance(sys.modules[POST_GRAD], _Deferred)
    parent_name, _, child = POST_GRAD.rpartition(".")
    try:
        if importlib.util.find_spec(POST_GRAD) is None:
            return False
        parent = importlib.import_module(parent_name)
    except ImportError:
        return False
    stand_in = _Deferred(POST_GRAD)
    stand_in.decompose_auto_functionalized = _decompose_auto_functionalized  # type: ignore[attr-defined]
    sys.modules[POST_GRAD] = stand_in
    setattr(parent, child, stand_in)
    return True


def module_origin(name: str) -> str | None:
    """The file module ``name`` is (or would be) loaded from, without importing it or its parents."""
    import importlib.machinery

    module = sys.modules.get(name)
    if module is not None:
        return getattr(module, "__file__", None)
    search: list[str] | None = None
    spec = None
    parts = name.split(".")
    for i in range(len(parts)):
        here = ".".join(parts[: i + 1])
        loaded = sys.modules.get(here)
        if loaded is not None and i < len(parts) - 1:
            search = list(getattr(loaded, "__path__", []) or [])
            continue
        try:
            spec = importlib.machinery.PathFinder.find_spec(here, search)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        search = list(spec.submodule_search_locations or [])
    return spec.origin if spec is not None and spec.has_location else None
