"""Skip torch's re-materialization of every composite op when no registration changed.

``run_decompositions`` (three per program in ExecuTorch's ``to_edge_transform_and_lower``)
collects the CompositeImplicitAutograd ops of every ``torch.ops`` namespace
(``torch._export.utils._collect_all_valid_cia_ops``), and for each namespace first
materializes *all* such ops of the C++ dispatcher (``_materialize_cpp_cia_ops``): about 40
full passes per collection, the same getattrs each time. Torch cannot cache it because a
registration may appear at any time; this memo keys it on the dispatcher's list of those
registrations, so a new one materializes again. The collection it feeds (and so every
decomposition) is unchanged; only the repeated getattrs go (issue 47: 47 ms -> 16 ms per
collection, measured beside ExecuTorch's NXP backend).

Reading that list is itself most of what is left (a list of every registration, once per
namespace). One collection only reads namespaces and op packets, it registers nothing, so
inside one collection the list is read once: its first namespace checks the key, the
others reuse the answer. A collection is told by wrapping the function under every name
torch's callers bind it to.

Each decomposition also overrides the kernels of every composite op in its table and puts
them back (``_override_composite_implicit_decomp``: about 6,000 ``py_impl`` calls), and each
``py_impl`` call evaluates its inner function's ``Callable[_P, _T]`` annotations, half of
that override's CPU (141 -> 72 ms, issue 47). :func:`_lazy_annotations` recompiles torch's
own ``OperatorBase.py_impl`` from its installed source with postponed annotations: the same
code, the annotations only never built. Used where one process lowers many programs: the
differential test's two sides.
"""

from __future__ import annotations
import __future__

import functools
import inspect
import textwrap
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch
import torch._export.utils as export_utils

_KEY = "CompositeImplicitAutograd"
_COLLECT = "_collect_all_valid_cia_ops"


def _callers() -> list[ModuleType]:
    """The modules that bind torch's collection under its own name (imported by value)."""
    import torch.export.decomp_utils as decomp_utils
    import torch.export.exported_program as exported_program

    return [m for m in (export_utils, exported_program, decomp_utils) if hasattr(m, _COLLECT)]


def _memoized(
    materialize: Callable[[], None], collect: Callable[[], Any]
) -> tuple[Callable[[], None], Callable[[], Any]]:
    done: list[list[str] | None] = [None]
    # inside a collection: whether its first namespace already checked the registrations
    checked: list[bool | None] = [None]

    def materialize_once() -> None:
        if checked[0]:
            return
        registered = torch._C._dispatch_get_registrations_for_dispatch_key(_KEY)
        if registered != done[0]:
            materialize()
            done[0] = registered
        if checked[0] is not None:
            checked[0] = True

    @functools.wraps(collect)
    def collect_checking_once() -> Any:
        outer = checked[0]
        checked[0] = False
        try:
            return collect()
        finally:
            checked[0] = outer

    return materialize_once, collect_checking_once


def _lazy_annotations() -> Callable[[], None]:
    """``OperatorBase.py_impl`` recompiled from torch's source with postponed annotations (it
    reads no annotation), at torch's own line numbers (tracebacks, ``inspect``); returns what
    puts the one it replaced back. Installed twice (nested), it recompiles torch's original."""
    import torch._ops as ops

    replaced = ops.OperatorBase.__dict__["py_impl"]
    original = getattr(replaced, "_torch_original", replaced)
    lines, first = inspect.getsourcelines(original)
    source = "\n" * (first - 1) + textwrap.dedent("".join(lines))
    code = compile(source, inspect.getsourcefile(original) or "<py_impl>", "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)  # fmt: skip
    defined: dict[str, Any] = {}
    exec(code, vars(ops), defined)  # torch's own module globals: the same names, live
    defined["py_impl"]._torch_original = original
    ops.OperatorBase.py_impl = defined["py_impl"]
    return lambda: setattr(ops.OperatorBase, "py_impl", replaced)


def _install() -> Callable[[], None]:
    """The memos in place; returns what puts torch's own functions back."""
    restore_py_impl = _lazy_annotations()
    original_materialize = export_utils._materialize_cpp_cia_ops
    callers = _callers()
    original_collect = [getattr(m, _COLLECT) for m in callers]
    materialize, collect = _memoized(original_materialize, export_utils._collect_all_valid_cia_ops)
    export_utils._materialize_cpp_cia_ops = materialize
    for m in callers:
        setattr(m, _COLLECT, collect)

    def restore() -> None:
        restore_py_impl()
        export_utils._materialize_cpp_cia_ops = original_materialize
        for m, f in zip(callers, original_collect, strict=True):
            setattr(m, _COLLECT, f)

    return restore


@contextmanager
def memoized() -> Iterator[None]:
    """The memo installed for the block, torch's own functions restored after it."""
    restore = _install()
    try:
        yield
    finally:
        restore()


def install() -> None:
    """The memo for the rest of the process (a child that lowers many programs)."""
    _install()
