"""The kernel libraries a firmware build can link, read from the yaml files ExecuTorch ships.

Each entry gives the operator's schema and the C++ kernel the registration must call.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

#: library name -> yaml path inside the executorch package, in lookup order.
LIBRARIES: dict[str, str] = {
    "cortex_m": "backends/cortex_m/ops/operators.yaml",
    "quantized": "kernels/quantized/quantized.yaml",
    "portable": "kernels/portable/functions.yaml",
    "portable_custom": "kernels/portable/custom_ops.yaml",
    "et_copy": "kernels/portable/et_copy_ops.yaml",
}


@dataclass(frozen=True)
class KernelInfo:
    library: str
    op: str  # "aten::add.out"
    schema: str  # full schema string with namespace
    cpp_namespace: str  # e.g. "torch::executor::native"
    function: str  # e.g. "add_out"


def _schema_from_torch(op: str) -> str | None:
    """The schema torch prints for ``op`` (from :mod:`etforge.codegen.torch_schemas`' table)."""
    return torch_facts()["schemas"].get(op)


@lru_cache(maxsize=1)
def torch_facts() -> dict[str, Any]:
    """Torch's schemas and tags of every operator of the libraries (stored; torch-free when warm)."""
    import json

    from etforge.codegen import torch_schemas

    return torch_schemas.table(json.dumps(_libraries(), sort_keys=True, default=str))


@lru_cache(maxsize=1)
def _libraries() -> dict[str, list[dict[str, Any]]]:
    """Each library's yaml entries, parsed once (libyaml when PyYAML has it: 10x faster)."""
    import importlib.util

    spec = importlib.util.find_spec("executorch")
    assert spec is not None and spec.submodule_search_locations
    root = Path(list(spec.submodule_search_locations)[0])
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    out: dict[str, list[dict[str, Any]]] = {}
    for library, rel in LIBRARIES.items():
        path = root / rel
        if path.is_file():
            out[library] = yaml.load(path.read_text(), Loader=loader) or []  # noqa: S506 (a safe loader)
    return out


@lru_cache(maxsize=1)
def catalogue() -> dict[str, KernelInfo]:
    """op -> kernel, first library wins (CMSIS-NN before quantized before portable)."""
    out: dict[str, KernelInfo] = {}
    for library, entries in _libraries().items():
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
                schema = _schema_from_torch(op_name)
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
