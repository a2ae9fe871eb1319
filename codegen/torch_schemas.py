"""What torch says about the kernel libraries' operators, kept so ``codegen`` need not import it.

Most portable kernels' yaml entries name their operator without a schema; the registration
needs the schema torch prints (it is in the generated comments) and the operator's tags
(torchgen's checks). Both are fixed by the installed torch, ExecuTorch and the yaml files, so
they are read once with torch -- in any compile, which imports torch anyway, or on a codegen's
first run -- and stored under the cache directory in a file named by the hash of exactly
those inputs. A missing, unreadable or foreign file is recomputed, never trusted;
``ETFORGE_NO_CACHE=1`` computes them in the process and stores nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

#: Bump when what is stored (or how it is computed) changes.
FORMAT = 1
SUBDIR = "torch-schemas"


def _aten(op: str) -> str:
    return op if "::" in op else f"aten::{op}"


def operators(libraries: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Every operator the libraries' entries name, sorted: the table's rows."""
    ops = set()
    for entries in libraries.values():
        for entry in entries:
            schema = entry.get("func")
            name = schema.split("(")[0] if schema else entry.get("op")
            if name:
                ops.add(_aten(name))
    return sorted(ops)


def _key(libraries: dict[str, list[dict[str, Any]]]) -> str:
    body = {
        "format": FORMAT,
        "torch": metadata.version("torch"),
        "executorch": metadata.version("executorch"),
        "libraries": libraries,
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def _from_torch(ops: list[str]) -> dict[str, Any]:
    import torch

    schemas: dict[str, str | None] = {}
    tags: dict[str, list[str]] = {}
    for op in ops:
        ns, _, rest = op.partition("::")
        name, _, overload = rest.partition(".")
        packet = getattr(getattr(torch.ops, ns, None), name, None)
        obj = getattr(packet, overload or "default", None) if packet is not None else None
        schemas[op] = str(obj._schema) if obj is not None else None
        tags[op] = sorted(t.name for t in getattr(obj, "tags", ()))
    return {"schemas": schemas, "tags": tags}


def _path(key: str) -> Path | None:
    from etforge.core.cache import store

    return store.default_dir() / SUBDIR / f"{key}.json" if store.enabled() else None


def _load(path: Path, key: str, ops: list[str]) -> dict[str, Any] | None:
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(table, dict) and table.get("key") == key
    ok = ok and all(set(table.get(f) or {}) == set(ops) for f in ("schemas", "tags"))
    return table if ok else None


def _store(path: Path, table: dict[str, Any]) -> None:
    """Written whole or not at all (a temporary file renamed into place); a read-only or full
    cache directory only costs the next codegen the torch import."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(table, f, sort_keys=True)
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


@lru_cache(maxsize=1)
def table(libraries_json: str) -> dict[str, Any]:
    """``{"schemas": {op: schema or None}, "tags": {op: [tag, ...]}}`` for every operator of
    ``libraries_json`` (the parsed yaml files, as JSON: hashable for the memo)."""
    libraries = json.loads(libraries_json)
    ops = operators(libraries)
    key = _key(libraries)
    path = _path(key)
    if path is not None and (cached := _load(path, key, ops)) is not None:
        return cached
    computed = {"key": key, **_from_torch(ops)}
    if path is not None:
        _store(path, computed)
    return computed
