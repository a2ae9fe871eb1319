"""Run inside ``.venv-explorer`` (Model Explorer and its PTE adapter; see ``.ci/setup``).

Usage: ``python node_ids.py FILE...`` (``.pte`` or ``.tflite``). Converts each file with the
adapter Model Explorer itself uses for it and prints ``{file: {graph id: [node ids]}}`` as
JSON: the ids a node-data file must use for Model Explorer to show its values.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _get(obj: Any, key: str) -> Any:
    """The adapters return dataclasses (PTE) or plain dicts (built-in TFLite)."""
    return obj[key] if isinstance(obj, dict) else getattr(obj, key)


def _graphs(converted: Any) -> list[Any]:
    if "graphCollections" in converted:
        return [g for c in converted["graphCollections"] for g in _get(c, "graphs")]
    return list(converted["graphs"])


def node_ids(path: str) -> dict[str, list[str]]:
    if path.endswith(".pte"):
        from pte_adapter_model_explorer.main import PTEAdapter

        converted = PTEAdapter().convert(path, {})
    else:
        from model_explorer.builtin_tflite_flatbuffer_adapter import BuiltinTfliteFlatbufferAdapter

        converted = BuiltinTfliteFlatbufferAdapter().convert(path, {})
    return {_get(g, "id"): sorted(_get(n, "id") for n in _get(g, "nodes")) for g in _graphs(converted)}


if __name__ == "__main__":
    json.dump({p: node_ids(p) for p in sys.argv[1:]}, sys.stdout)
