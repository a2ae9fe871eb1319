"""A device run's instruction counts per Edge node and per NPU partition.

The firmware runner counts emulator instructions per ExecuTorch instruction
(``runtime/firmware/device.py``, ``per_op``). ExecuTorch's emitter records which node each
instruction runs (``debug_handle_map``, kept in ``report.json`` as ``instruction_handles``);
the report's nodes carry the same debug handles, so each instruction's count lands on the
Edge node it lowers (a node the CPU lowering decomposed gets all its instructions; nodes that
share a handle — a decomposition's parts — share the row), and each delegate call on its NPU
partition, in program order. Counts are QEMU's ``-icount`` instructions, not device cycles:
every figure here says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Said next to every figure this module produces.
LABEL = "emulator instruction count (QEMU -icount), not device cycles"


def per_node(report: dict[str, Any], per_op: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``{"label", "total", "nodes": [...], "partitions": [...], "other": [...]}`` from one
    sample's per-instruction counts. ``other`` lists instructions no report node claims (a
    layout copy the CPU lowering inserted, a planned input quantize), each with its op."""
    handles = report.get("instruction_handles") or {}
    by_handle: dict[int, list[dict[str, Any]]] = {}
    for n in report.get("nodes", []):
        if n.get("debug_handle") is not None and n.get("placement") != "npu":
            by_handle.setdefault(int(n["debug_handle"]), []).append(n)
    rows: dict[str, dict[str, Any]] = {}
    parts: list[dict[str, Any]] = []
    other: list[dict[str, Any]] = []
    for item in per_op:
        index, op, count = int(item["instruction"]), str(item["op"]), int(item["instructions"])
        if op.startswith("delegate"):
            # the delegate's own partition name (runtime/firmware/device._per_op), not the
            # report's n-th partition: ExecuTorch calls delegates in program order
            parts.append({"partition": item.get("partition"), "instruction": index, "instructions": count})
            continue
        handle = handles.get(str(index))
        owners = by_handle.get(int(handle), []) if handle is not None else []
        if not owners:
            other.append({"instruction": index, "op": op, "instructions": count})
            continue
        key = ", ".join(n["node"] for n in owners)
        row = rows.setdefault(
            key,
            {
                "node": key,
                "op": owners[0].get("op"),
                "debug_handle": handle,
                "kernel_ops": [],
                "instructions": 0,
            },
        )
        row["instructions"] += count
        if op not in row["kernel_ops"]:
            row["kernel_ops"].append(op)
    total = sum(int(i["instructions"]) for i in per_op)
    return {
        "label": LABEL,
        "total": total,
        "nodes": sorted(rows.values(), key=lambda r: -r["instructions"]),
        "partitions": parts,
        "other": other,
    }


def node_counts(profile: dict[str, Any]) -> dict[str, int]:
    """Edge node name -> its instructions (a shared row counts for each of its nodes)."""
    out: dict[str, int] = {}
    for row in profile.get("nodes", []):
        for name in str(row["node"]).split(", "):
            out[name] = int(row["instructions"])
    return out
