"""Deferred Python code generation for ``torch.fx.GraphModule`` during a compile.

Why: every ``GraphModule`` built or edited calls ``recompile()``, which writes the graph out as
Python source and ``exec``s it. ExecuTorch's and torchao's passes do that after every re-trace
and every pass-manager check, and almost none of those modules ever run their ``forward``: on
a torchvision model a fifth of the compile's wall time was spent writing code nobody read.

Inside :func:`deferred_code`, ``recompile()`` records that the code is stale and installs a
descriptor as the module's ``forward``. The first use of anything generated — ``forward``
(a call, ``inspect.signature``, a tracer reading ``type(gm).forward``), ``code``, ``str()``,
pickling, ``recompile()``'s return value — generates it then, from the graph as it is.
On leaving the outermost scope, every module still stale is generated and torch's own methods
are back, so what leaves the scope is what eager ``recompile()`` calls would have left.

The graph is never touched, so programs, ``.pte`` and ``.tflite`` bytes are unchanged
(``tests/test_deferred_code.py`` compares them with eager code generation).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import weakref
from collections.abc import Iterator
from typing import Any

from torch.fx import GraphModule
from torch.fx._lazy_graph_module import _LazyGraphModule
from torch.fx.graph import PythonCode, _PyTreeCodeGen

_EAGER_RECOMPILE = GraphModule.recompile
_EAGER_CODE: property = GraphModule.__dict__["code"]
#: Methods that read the generated code (``_code``) directly: each generates it first.
_READERS: dict[str, Any] = {
    name: GraphModule.__dict__[name] for name in ("__str__", "__reduce__", "__reduce_package__", "to_folder")
}

#: Off: ``deferred_code()`` changes nothing (the tests compare compiles both ways).
ENABLED = True

_lock = threading.RLock()
_depth = 0
#: Modules whose generated code is behind their graph. Weak: a module dropped while stale
#: (most re-trace results) never pays for its code.
_stale: weakref.WeakSet[GraphModule] = weakref.WeakSet()


def generate(gm: GraphModule) -> PythonCode:
    """Generate ``gm``'s code now (torch's own ``recompile``)."""
    with _lock:
        _stale.discard(gm)
    return _EAGER_RECOMPILE(gm)


def _generate_if_stale(gm: GraphModule) -> None:
    if type(gm).__dict__.get("forward").__class__ is _PendingForward:
        generate(gm)


class _PendingForward:
    """A stale module's ``forward``: reading it (from the instance or its own class —
    each ``GraphModule`` has a class of its own) generates the code first."""

    __slots__ = ("module",)

    def __init__(self, gm: GraphModule) -> None:
        self.module = weakref.ref(gm)

    def __get__(self, obj: GraphModule | None, cls: type | None = None) -> Any:
        gm = obj if obj is not None else self.module()
        if gm is None:
            raise RuntimeError("forward of a GraphModule that no longer exists")
        generate(gm)
        real = type(gm).__dict__.get("forward")
        if isinstance(real, _PendingForward):  # torch's recompile did not install a forward
            raise RuntimeError(f"code generation left {type(gm).__name__} without a forward")
        return real.__get__(obj, cls) if obj is not None else real


class _DeferredPythonCode:
    """What a deferred ``recompile()`` returns: the ``PythonCode``, generated when read."""

    __slots__ = ("module", "code")

    def __init__(self, gm: GraphModule) -> None:
        self.module = gm
        self.code: PythonCode | None = None

    def __getattr__(self, name: str) -> Any:
        if self.code is None:
            self.code = generate(self.module)
        return getattr(self.code, name)


def _deferred_recompile(self: GraphModule) -> Any:
    if isinstance(self, _LazyGraphModule):  # torch's own lazy modules call up to us for real code
        return _EAGER_RECOMPILE(self)
    if isinstance(self._graph._codegen, _PyTreeCodeGen):  # as torch's recompile: specs at once
        self._in_spec = self._graph._codegen.pytree_info.in_spec
        self._out_spec = self._graph._codegen.pytree_info.out_spec
    type(self).forward = _PendingForward(self)
    with _lock:
        _stale.add(self)
    return _DeferredPythonCode(self)


def _code(self: GraphModule) -> str:
    _generate_if_stale(self)
    return _EAGER_CODE.fget(self)  # type: ignore[misc]


def _reader(method: Any) -> Any:
    @functools.wraps(method)
    def read(self: GraphModule, *args: Any, **kwargs: Any) -> Any:
        _generate_if_stale(self)
        return method(self, *args, **kwargs)

    return read


_DEFERRED_READERS = {name: _reader(method) for name, method in _READERS.items()}


@contextlib.contextmanager
def deferred_code() -> Iterator[None]:
    """Defer ``GraphModule`` code generation to first use while inside (re-entrant, thread-safe:
    torch's methods come back when the last scope in the process ends)."""
    global _depth
    if not ENABLED:
        yield
        return
    with _lock:
        if _depth == 0:
            GraphModule.recompile = _deferred_recompile  # type: ignore[method-assign]
            GraphModule.code = property(_code)  # type: ignore[method-assign,assignment]
            for name, method in _DEFERRED_READERS.items():
                setattr(GraphModule, name, method)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                GraphModule.recompile = _EAGER_RECOMPILE  # type: ignore[method-assign]
                GraphModule.code = _EAGER_CODE  # type: ignore[method-assign,assignment]
                for name, method in _READERS.items():
                    setattr(GraphModule, name, method)
                pending = list(_stale)
                _stale.clear()
                for gm in pending:  # torch's methods again: what leaves is eager torch's state
                    _EAGER_RECOMPILE(gm)
