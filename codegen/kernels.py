"""The kernel libraries a firmware build can link, read from their operator yaml files.

The libraries are the ones the CPU backend plugins declare (``CpuBackend.kernel_libraries``:
CMSIS-NN's ``cortex_m`` before ExecuTorch's quantized and portable ones); a plugin's own
library comes with it. Each entry gives the operator's schema and the C++ kernel the
registration must call.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from etforge.core.contracts.cpu_backend import KernelLibrary
from etforge.core.registry.manager import Registry, registry


@dataclass(frozen=True)
class KernelInfo:
    library: str
    op: str  # "aten::add.out"
    schema: str  # full schema string with namespace
    cpp_namespace: str  # e.g. "torch::executor::native"
    function: str  # e.g. "add_out"


def _schema_from_torch(op: str, reg: Registry) -> str | None:
    """The schema torch prints for ``op`` (from :mod:`etforge.codegen.torch_schemas`' table)."""
    return torch_facts(reg)["schemas"].get(op)


def torch_facts(reg: Registry | None = None) -> dict[str, Any]:
    """Torch's schemas and tags of every operator of the libraries (stored; torch-free when warm)."""
    return _torch_facts(reg or registry())


@lru_cache(maxsize=4)
def _torch_facts(reg: Registry) -> dict[str, Any]:
    import json

    from etforge.codegen import torch_schemas

    return torch_schemas.table(json.dumps(_parsed(reg), sort_keys=True, default=str))


def libraries(reg: Registry | None = None) -> dict[str, str]:
    """Library name -> its yaml path (relative to the ``executorch`` package, or absolute), in
    lookup order: every CPU backend's ``kernel_libraries`` merged, each backend's own order
    kept (a library first named by a later backend goes before the first library it precedes)."""
    merged: list[KernelLibrary] = []
    for backend in (reg or registry()).cpu_backends.values():
        libs = list(backend.kernel_libraries)
        for i, lib in enumerate(libs):
            if any(m.name == lib.name for m in merged):
                continue
            later = {x.name for x in libs[i + 1 :]}
            at = next((j for j, m in enumerate(merged) if m.name in later), len(merged))
            merged.insert(at, lib)
    return {lib.name: lib.yaml for lib in merged}


@lru_cache(maxsize=4)
def _parsed(reg: Registry) -> dict[str, list[dict[str, Any]]]:
    """Each library's yaml entries, parsed once (libyaml when PyYAML has it: 10x faster)."""
    import importlib.util

    spec = importlib.util.find_spec("executorch")
    assert spec is not None and spec.submodule_search_locations
    root = Path(list(spec.submodule_search_locations)[0])
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    out: dict[str, list[dict[str, Any]]] = {}
    for library, rel in libraries(reg).items():
        path = root / rel
        if path.is_file():
            out[library] = yaml.load(path.read_text(), Loader=loader) or []  # noqa: S506 (a safe loader)
    return out


def catalogue() -> dict[str, KernelInfo]:
    """op -> kernel, first library wins (CMSIS-NN before quantized before portable)."""
    return _catalogue(registry())


@lru_cache(maxsize=4)
def _catalogue(reg: Registry) -> dict[str, KernelInfo]:
    out: dict[str, KernelInfo] = {}
    for library, entries in _parsed(reg).items():
        for entry in entries:
            schema = entry.get("func")
            op_name = schema.split("(")[0] if schema else entry.get("op")
            if not op_name:
                continue
            if "::" not in op_name:
                op_name = f"aten::{op_name}"
            kernels = entry.get("kernels") or []
            kernel_name = next((k.get("kernel_name") for k in kernels if k.get("kernel_name")), None)
            if kernel_name is None:
                continue
            if schema is None:
                schema = _schema_from_torch(op_name, reg)
                if schema is None:
                    continue
            elif "::" not in schema.split("(")[0]:
                schema = f"aten::{schema}"
            ns, _, fn = kernel_name.rpartition("::")
            out.setdefault(op_name, KernelInfo(library, op_name, schema, f"{ns}::native", fn))
    return out


def library_sizes() -> dict[str, int]:
    sizes: dict[str, int] = {}
    for k in catalogue().values():
        sizes[k.library] = sizes.get(k.library, 0) + 1
    return sizes
