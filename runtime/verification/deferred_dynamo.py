"""Dynamo's and Inductor's package inits left unrun by ``etforge verify``: it traces nothing.

Importing ``torch._dynamo`` whole (its tracer, guards, variable trackers, polyfills; with it
``torch._inductor``'s init) is about a sixth of verify's main thread. Verify reached it by four
doors, none of which uses Dynamo:

- Inductor's package init (the parent of the decomposition table ``deferred_imports`` holds)
  imports Dynamo whole;
- torch's serializer imports ``torch._export.non_strict_utils`` for one context manager (graph
  inputs that are ``nn.Module`` s: a saved program etforge reads has tensors), and that module
  imports Dynamo's variable trackers: here a stand-in serves those functions (:class:`_NonStrict`);
- ExecuTorch's tracer imports ``Guard`` from ``torch._dynamo.guards``, which is torch's own
  ``torch._guards.Guard``: a stand-in holds that name (:class:`_Stand`);
- each fake-tensor dispatch of a load asks ``torch._dynamo.disable`` to wrap it
  (``torch._compile``), and ``torch.export``'s unlifting decorates with it: with Dynamo never
  started no frame is traced, so the call runs as it is (:func:`_disable`), until Dynamo runs in
  full (then through Dynamo's own wrapper).

Both packages stand in with their ``__init__`` unrun (:class:`_Package`); the submodules a
load imports (``ALONE``) import by themselves. Anything else — another attribute of a package
or stand-in, another submodule (:class:`_InitFirst`) — first runs both inits in full, in
Dynamo's own order with the stand-ins taken out (:func:`run_in_full`): what was deferred is then
there as without the deferral, and the answer is the real one. Only the command defers them,
and only to verify a compile's output (a script's ``.pte`` exports its model: Dynamo runs).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

from etforge.core.common.lazy_imports import take_out

DYNAMO, INDUCTOR = "torch._dynamo", "torch._inductor"
GUARDS, NON_STRICT = "torch._dynamo.guards", "torch._export.non_strict_utils"
#: The submodules a verify imports, each importing nothing of Dynamo's tracer (found on
#: MobileNetV2 and the test models on both kinds of target: torch.export's and ExecuTorch's loads,
#: the fake tensors' ``ShapeEnv``, Inductor's configuration that ExecuTorch and torchao read).
#: Any other submodule runs the inits first: slower, never wrong.
ALONE = frozenset(
    {
        *(f"{DYNAMO}.{m}" for m in ("callback", "config", "device_interface", "exc", "external_utils")),
        *(f"{DYNAMO}.{m}" for m in ("graph_utils", "metrics_context", "utils")),
        *(f"{INDUCTOR}.{m}" for m in ("analysis", "analysis.device_info", "config", "cpp_builder")),
        *(f"{INDUCTOR}.{m}" for m in ("cpu_vec_isa", "custom_graph_pass", "decomposition", "exc")),
        *(f"{INDUCTOR}.{m}" for m in ("fx_passes", "fx_passes.post_grad", "runtime", "utils")),
        *(f"{INDUCTOR}.runtime.{m}" for m in ("cache_dir_utils", "hints", "runtime_utils")),
    }
)
#: What torch's serializer reads as an attribute of its package, which Dynamo's import imported.
READ_AS_ATTRIBUTE = ("torch._higher_order_ops.triton_kernel_wrap",)

_lock = threading.RLock()
_running = False


class _Package(types.ModuleType):
    """A package whose ``__init__`` has not run: its submodules import alone (``ALONE``; any
    other runs the inits first, :class:`_InitFirst`), any other name runs the inits first."""

    _etforge_from: dict[str, str]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if f"{self.__name__}.{name}" in ALONE:
            return importlib.import_module(f"{self.__name__}.{name}")
        source = self.__dict__.get("_etforge_from", {}).get(name)
        if source is not None:  # what the __init__ binds from a module that imports alone
            return getattr(importlib.import_module(source), name)
        run_in_full()
        return getattr(sys.modules[self.__name__], name)


class _Stand(types.ModuleType):
    """A module's stand-in holding the names set on it; any other runs the inits first."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        run_in_full()
        return getattr(importlib.import_module(self.__name__), name)


def deferred() -> bool:
    """Is Dynamo's package init still unrun?"""
    return isinstance(sys.modules.get(DYNAMO), _Package)


def _module_types(args: Any) -> set[type]:
    """The ``nn.Module`` types among ``args``' leaves (graph inputs torch.export registers)."""
    import torch
    import torch.utils._pytree as pytree

    if args is None:
        return set()
    return {type(leaf) for leaf in pytree.tree_leaves(args) if isinstance(leaf, torch.nn.Module)}


def _real(name: str) -> Callable[..., Any]:
    """The real ``non_strict_utils`` function ``name`` (the inits run first)."""
    run_in_full()
    return getattr(importlib.import_module(NON_STRICT), name)  # type: ignore[no-any-return]


class _NonStrict(_Stand):
    """``torch._export.non_strict_utils``'s graph-input functions: with no ``nn.Module`` among
    the inputs they have nothing to register; with one, the real functions run."""

    @staticmethod
    @contextlib.contextmanager
    def _enable_graph_inputs_of_type_nn_module(args: Any) -> Iterator[None]:
        if not _module_types(args):
            yield
            return
        with _real("_enable_graph_inputs_of_type_nn_module")(args):
            yield

    @staticmethod
    def _get_graph_inputs_of_type_nn_module(args: Any) -> set[type]:
        return _module_types(args)

    @staticmethod
    def _enter_enable_graph_inputs_of_type_nn_module(module_types: set[type]) -> None:
        if module_types:
            _real("_enter_enable_graph_inputs_of_type_nn_module")(module_types)

    @staticmethod
    def _exit_enable_graph_inputs_of_type_nn_module(module_types: set[type]) -> None:
        if module_types:
            _real("_exit_enable_graph_inputs_of_type_nn_module")(module_types)


def _disable(
    fn: Callable[..., Any] | None = None,
    recursive: bool = True,
    *,
    reason: str | None = None,
    wrapping: bool = True,
) -> Any:
    """``torch._dynamo.disable`` while Dynamo has not started: no frame is traced, so the
    function runs as it is; once Dynamo runs, through Dynamo's own wrapper. A callable other
    than a function or method runs the inits first."""
    import functools
    import inspect

    if fn is None and deferred():
        return functools.partial(_disable, recursive=recursive, reason=reason, wrapping=wrapping)
    if not deferred() or not (inspect.isfunction(fn) or inspect.ismethod(fn) or inspect.isbuiltin(fn)):
        run_in_full()
        return sys.modules[DYNAMO].disable(fn, recursive, reason=reason, wrapping=wrapping)
    wrapped: list[Callable[..., Any]] = []

    def call(*args: Any, **kwargs: Any) -> Any:
        if deferred():
            return fn(*args, **kwargs)
        if not wrapped:
            wrapped.append(sys.modules[DYNAMO].disable(fn, recursive, reason=reason, wrapping=False))
        return wrapped[0](*args, **kwargs)

    return functools.wraps(fn)(call) if wrapping else call


class _AfterInits(importlib.abc.Loader):
    """Loads a submodule outside ``ALONE`` after the inits ran (which may have imported it:
    then that module, its own spec kept)."""

    def __init__(self, spec: importlib.machinery.ModuleSpec) -> None:
        self.spec = spec
        self.done: types.ModuleType | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        run_in_full()
        self.done = sys.modules.get(spec.name)
        if self.done is not None:
            self.kept = (self.done.__spec__, getattr(self.done, "__loader__", None))
            return self.done
        assert self.spec.loader is not None
        return self.spec.loader.create_module(self.spec)

    def exec_module(self, module: types.ModuleType) -> None:
        if self.done is not None:
            module.__spec__, module.__loader__ = self.kept
            return
        module.__spec__, module.__loader__ = self.spec, self.spec.loader
        assert self.spec.loader is not None
        self.spec.loader.exec_module(module)


class _InitFirst(importlib.abc.MetaPathFinder):
    """Finds a submodule of the deferred packages outside ``ALONE`` with :class:`_AfterInits`
    (imported alone, it could find its package half there: Dynamo's modules import each other
    in its ``__init__``'s order); finds nothing else."""

    def find_spec(
        self, name: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if _running or name in ALONE or not name.startswith((f"{DYNAMO}.", f"{INDUCTOR}.")) or not deferred():
            return None
        real = importlib.machinery.PathFinder.find_spec(name, path)
        if real is None or real.loader is None:
            return None
        spec = importlib.util.spec_from_loader(name, _AfterInits(real), origin=real.origin)
        assert spec is not None
        spec.submodule_search_locations = real.submodule_search_locations
        return spec


def run_in_full() -> None:
    """Run Dynamo's and then Inductor's ``__init__`` (the stand-ins taken out first): from now
    on both are as without the deferral."""
    global _running
    with _lock:
        if _running or not deferred():
            return
        _running = True
        try:
            take_out(GUARDS, _Stand)
            take_out(NON_STRICT, _Stand)
            for name in (DYNAMO, INDUCTOR):
                module = sys.modules[name]
                if isinstance(module, _Package):
                    module.__dict__.pop("_etforge_from", None)
                    if module.__dict__.get("disable") is _disable:  # the init binds Dynamo's own
                        del module.__dict__["disable"]
                    module.__class__ = types.ModuleType
                    assert module.__spec__ is not None and module.__spec__.loader is not None
                    module.__spec__.loader.exec_module(module)
        finally:
            _running = False
            for finder in [f for f in sys.meta_path if isinstance(f, _InitFirst)]:
                sys.meta_path.remove(finder)


def _bound_from_alone(package: str, source: str) -> dict[str, str]:
    """Each name the ``__init__`` binds by ``from .M import N`` (N itself, not renamed) where
    M imports alone (``ALONE``): name -> M."""
    import ast

    found: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            module = f"{package}.{node.module}"
            if module in ALONE:
                found.update({a.name: module for a in node.names if a.asname in (None, a.name)})
    return found


def _package(name: str) -> _Package | None:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or not spec.submodule_search_locations or spec.origin is None:
        return None
    with open(spec.origin, encoding="utf-8") as f:
        bound = _bound_from_alone(name, f.read())
    module = importlib.util.module_from_spec(spec)
    module.__class__ = _Package
    module._etforge_from = bound  # type: ignore[attr-defined]
    return module  # type: ignore[return-value]


def defer() -> bool:
    """Defer Dynamo's and Inductor's package inits (before anything imports them); True when
    they are deferred."""
    if any(name in sys.modules for name in (DYNAMO, INDUCTOR, GUARDS, NON_STRICT)):
        return deferred()
    import torch
    import torch._guards

    try:
        packages = [_package(name) for name in (DYNAMO, INDUCTOR)]
    except (ImportError, ValueError, OSError, SyntaxError):
        return False
    if any(p is None for p in packages):
        return False
    for package in packages:
        assert package is not None
        sys.modules[package.__name__] = package
        setattr(torch, package.__name__.rpartition(".")[2], package)
    packages[0].disable = _disable  # type: ignore[union-attr]
    guards = _Stand(GUARDS)
    guards.Guard = torch._guards.Guard  # type: ignore[attr-defined]
    sys.modules[GUARDS] = guards
    packages[0].guards = guards  # type: ignore[union-attr]
    non_strict = _NonStrict(NON_STRICT)
    sys.modules[NON_STRICT] = non_strict
    import torch._export

    torch._export.non_strict_utils = non_strict  # type: ignore[attr-defined]
    sys.meta_path.insert(0, _InitFirst())
    for name in READ_AS_ATTRIBUTE:
        importlib.import_module(name)
    return True
