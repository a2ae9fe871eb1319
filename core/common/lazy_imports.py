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

:func:`defer_package_inits` does the same for packages whose ``__init__`` imports a whole
backend when a compile needs a few of its modules: ExecuTorch's Cortex-M quantizer and passes
read four helpers from the Arm backend's pass and quantizer packages and one base class from
XNNPACK's, and each package's ``__init__`` imports its every pass, quantizer and partitioner
(importing the Cortex-M quantizer and passes: 0.45 s of CPU, 0.11 s deferred). The package
stands in with its ``__init__`` not run: its submodules import as usual (``from package import
submodule`` too, unless the ``__init__`` binds that name otherwise), a name the ``__init__``
imports from a module is read from that module, and any other name runs the ``__init__`` in
full, once. No module of these packages registers an op or a backend the compile looks up;
XNNPACK's ``BackendDetails`` appears once its ``__init__`` runs. ``etforge verify`` defers
:data:`HOST_DEFERRED_INITS` and the packages its CPU backends name in
``CpuBackend.host_deferred_inits`` (a library's passes package, where the op library is all
a host run needs). ``torch._dynamo``'s and ``torch._inductor``'s package inits, which
``torch.export.load`` reached, are deferred by verify too, with their own rules
(``runtime/verification/deferred_dynamo.py``: a few submodules import alone, anything else
runs both inits in Dynamo's order). What verify cannot defer, measured: sympy (a
``ShapeEnv``), and ExecuTorch's Edge-dialect verifier, which reading ``lowered_edge.exir``
needs, imports ``executorch.exir.passes`` and with it torchao.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
import types
from typing import Any

POST_GRAD = "torch._inductor.fx_passes.post_grad"


class Deferred(types.ModuleType):
    """Stands in for a module until an attribute of it is read (:func:`install_stand_in`)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(load(self.__name__), name)


def install_stand_in(stand_in: Deferred) -> None:
    """Put ``stand_in`` where its module would be: in ``sys.modules`` and on its (imported) parent."""
    parent_name, _, child = stand_in.__name__.rpartition(".")
    parent = importlib.import_module(parent_name)
    sys.modules[stand_in.__name__] = stand_in
    setattr(parent, child, stand_in)


def take_out(name: str, kind: type[types.ModuleType]) -> None:
    """Remove a stand-in of the stand-in class ``kind`` held for ``name`` (from ``sys.modules``
    and from its parent), if one is there; anything else held there stays."""
    held = sys.modules.get(name)
    if isinstance(held, kind):
        del sys.modules[name]
        parent, _, child = name.rpartition(".")
        if getattr(sys.modules.get(parent), child, None) is held:
            delattr(sys.modules[parent], child)


def load(name: str) -> types.ModuleType:
    """The real module ``name``: a stand-in in its place is taken out first, then it is imported."""
    take_out(name, Deferred)
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
    return load(POST_GRAD).decompose_auto_functionalized(graph)


def defer_inductor_post_grad() -> bool:
    """Defer Inductor's post-grad passes; True when the stand-in is in place."""
    if POST_GRAD in sys.modules:
        return isinstance(sys.modules[POST_GRAD], Deferred)
    stand_in = Deferred(POST_GRAD)
    stand_in.decompose_auto_functionalized = _decompose_auto_functionalized  # type: ignore[attr-defined]
    try:
        if importlib.util.find_spec(POST_GRAD) is None:
            return False
        install_stand_in(stand_in)
    except ImportError:
        return False
    return True


#: Packages whose ``__init__`` the command defers (:func:`defer_package_inits`).
DEFERRED_INITS = (
    "executorch.backends.arm.quantizer",
    "executorch.backends.arm._passes",
    "executorch.backends.xnnpack",
    "executorch.backends.xnnpack._passes",
)

#: What ``etforge verify`` defers besides: the Arm backend's own ``__init__`` imports its MX-format
#: extension (torchao's prototype formats, the TOSA dialect) that no host run reads. Compile keeps
#: it: its CPU backends run Arm's passes, which import that extension themselves.
HOST_DEFERRED_INITS = ("executorch.backends.arm", *DEFERRED_INITS)


class _DeferredInit(types.ModuleType):
    """A package whose ``__init__`` has not run yet (see :func:`defer_package_inits`)."""

    _etforge_imports: dict[str, tuple[str, str | None]]

    def __getattr__(self, name: str) -> Any:
        source = self.__dict__.get("_etforge_imports", {}).get(name)
        if source is not None:
            module, attr = source
            value = importlib.import_module(module)
            if attr is not None:  # as ``from M import N`` reads it: M's attribute, else its submodule
                value = (
                    getattr(value, attr)
                    if hasattr(value, attr)
                    else importlib.import_module(f"{module}.{attr}")
                )
            setattr(self, name, value)
            return value
        if name.startswith("__") and name != "__all__":
            raise AttributeError(name)
        if name not in self.__dict__.get("_etforge_bound", ()) and _is_submodule(self, name):
            # the submodule alone: importing it binds it here, as the import system does
            return importlib.import_module(f"{self.__name__}.{name}")
        _run_init(self)
        return getattr(self, name)  # now a plain module: its own ``__getattr__`` (PEP 562) too


def run_deferred_init(name: str) -> bool:
    """Run the deferred ``__init__`` of package ``name`` now (every name it binds, every op it
    registers); False when that package is not a deferred one (already run, or never deferred)."""
    module = sys.modules.get(name)
    if not isinstance(module, _DeferredInit):
        return False
    _run_init(module)  # the stand-in becomes the package, as on a name read
    return True


def _is_submodule(package: types.ModuleType, name: str) -> bool:
    """Is ``name`` a module of ``package``'s own directory (found without importing anything)?"""
    import importlib.machinery

    try:
        spec = importlib.machinery.PathFinder.find_spec(f"{package.__name__}.{name}", list(package.__path__))
    except (ImportError, ValueError):
        return False
    return spec is not None


def _run_init(module: _DeferredInit) -> None:
    """Run the package's own ``__init__`` into the stand-in, once: it is the package from now on."""
    module.__dict__.pop("_etforge_imports", None)
    module.__dict__.pop("_etforge_bound", None)
    module.__class__ = types.ModuleType
    spec = module.__spec__
    assert spec is not None and spec.loader is not None
    spec.loader.exec_module(module)


def _init_imports(package: str, source: str) -> dict[str, tuple[str, str | None]]:
    """Each name the ``__init__`` binds by a top-level ``from M import N``: (module, attribute);
    ``from . import sub`` gives (the submodule, None). Names bound any other way are absent."""
    table: dict[str, tuple[str, str | None]] = {}
    for node in ast.parse(source).body:
        if not isinstance(node, ast.ImportFrom) or node.level > 1:
            continue
        base = node.module or ""
        if node.level == 1:
            base = f"{package}.{base}" if base else package
        for alias in node.names:
            if alias.name == "*":
                continue
            bound = alias.asname or alias.name
            table[bound] = (f"{base}.{alias.name}", None) if base == package else (base, alias.name)
    return table


def _init_bound(source: str) -> frozenset[str]:
    """Every name the ``__init__``'s top level binds (assigned, defined or imported)."""
    bound: set[str] = set()
    todo: list[ast.AST] = list(ast.parse(source).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)  # its body is its own scope
            continue
        if isinstance(node, ast.Lambda):
            continue
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        todo.extend(ast.iter_child_nodes(node))
    return frozenset(bound)


def defer_package_inits(names: tuple[str, ...] = DEFERRED_INITS) -> list[str]:
    """Put a stand-in for each package of ``names`` not imported yet; returns those deferred."""
    deferred = []
    for name in names:
        if name in sys.modules:
            continue
        parent_name, _, child = name.rpartition(".")
        try:
            parent = importlib.import_module(parent_name) if parent_name else None
            spec = importlib.util.find_spec(name)
        except ImportError:
            continue
        if spec is None or spec.loader is None or not spec.submodule_search_locations or spec.origin is None:
            continue
        try:
            with open(spec.origin, encoding="utf-8") as f:
                source = f.read()
            imports, bound = _init_imports(name, source), _init_bound(source)
        except (OSError, SyntaxError, ValueError):
            continue
        module = importlib.util.module_from_spec(spec)
        module.__class__ = _DeferredInit
        module._etforge_imports = imports  # type: ignore[attr-defined]
        module._etforge_bound = bound  # type: ignore[attr-defined]
        sys.modules[name] = module
        if parent is not None:
            setattr(parent, child, module)
        deferred.append(name)
    return deferred


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


#: ExecuTorch's Edge-dialect module: it parses its ``edge.yaml`` (the dtype rules of 141 ops)
#: with ruamel when imported (:func:`cache_edge_dialect_yaml`).
EDGE_OPS = "executorch.exir.dialects.edge._ops"
#: Where in the cache directory those parses are kept (``etforge cache clear`` removes it).
EDGE_YAML_DIR = "edge-dialect"


def _plain(value: Any) -> bool:
    """Does ``value`` come back from JSON as itself (types included: no tuple, no int key)?"""
    if type(value) is dict:
        return all(type(k) is str and _plain(v) for k, v in value.items())
    if type(value) is list:
        return all(_plain(v) for v in value)
    return value is None or type(value) in (str, int, float, bool)


class _EdgeYamlFinder:
    """Finds nothing: seeing :data:`EDGE_OPS` about to load, it has ruamel's ``YAML`` answer
    that module's one ``load`` from the cache (then gets out of the way)."""

    def __init__(self, cache_dir: Any) -> None:
        self.cache_dir = cache_dir

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name != EDGE_OPS:
            return None
        sys.meta_path.remove(self)
        try:
            import ruamel.yaml
        except ImportError:
            return None
        real, cache_dir = ruamel.yaml.YAML, self.cache_dir

        class CachedYAML(real):  # type: ignore[misc, valid-type]
            def load(self, stream: Any) -> Any:
                ruamel.yaml.YAML = real  # once: any other YAML is ruamel's own again
                if not isinstance(stream, str):
                    return super().load(stream)
                import hashlib
                import json
                import os

                key = hashlib.sha256(
                    json.dumps(
                        [ruamel.yaml.__version__, self.typ, getattr(self, "pure", None), stream]
                    ).encode()
                ).hexdigest()
                path = cache_dir / EDGE_YAML_DIR / f"{key}.json"
                try:
                    return json.loads(path.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    pass
                data = super().load(stream)
                if _plain(data):
                    try:
                        path.parent.mkdir(parents=True, exist_ok=True)
                        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
                        tmp.write_text(json.dumps(data), encoding="utf-8")
                        os.replace(tmp, path)
                    except OSError:
                        pass  # read-only or full: parsed again next time
                return data

        ruamel.yaml.YAML = CachedYAML
        return None


def cache_edge_dialect_yaml(cache_dir: Any) -> bool:
    """Keep ExecuTorch's parse of its ``edge.yaml`` in ``cache_dir``: importing
    :data:`EDGE_OPS` parses the file with ruamel (0.15 s of CPU on every compile and verify),
    the cached JSON takes 1 ms. The key is the sha256 of ruamel's version, the loader type
    and the text itself, so what comes back is what ruamel returns for that text; a parse
    JSON would not give back as it is (a tuple, a non-string key) is never cached. Only
    the command calls it; True when the finder is in place."""
    if EDGE_OPS in sys.modules:
        return False
    sys.meta_path.insert(0, _EdgeYamlFinder(cache_dir))  # type: ignore[arg-type]
    return True
