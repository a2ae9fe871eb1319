"""The placement overlay in Model Explorer's node-data format (``report --model-explorer DIR``).

Model Explorer (``ai-edge-model-explorer``) colours a loaded graph from a node-data JSON
file: ``{graph id: {"results": {node id: {"value": v, "bgColor": c}}, ...}}`` (its
``ModelNodeData``). The ids are the ones its adapters give when they load the files:

* ``model.pte`` (``pte-adapter-model-explorer``): one graph per execution plan, named like
  the plan (``forward``); each instruction is the node ``{plan}_{chain}_{instruction}``.
  A delegate call gets ``NPU <partition>``, a kernel call the CPU kernel library whose
  operator it calls (CMSIS-NN ``cortex_m::``, ``quantized_decomposed::``, portable).
* each ``partitions/<name>.tflite`` (Model Explorer's built-in TFLite adapter): the
  subgraph's name is the graph id, each operator its index; the value is the MACs of the
  Edge nodes the operator runs, coloured on a gradient, so the heavy operators stand out.

String values carry their colour (``bgColor``), the same as in the HTML picture.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from etforge.codegen.placement_html import CMSIS_NN, CPU_COLOURS, NPU_COLOURS, PORTABLE, QUANTIZED
from etforge.core.common.errors import EtforgeError

#: Gradient of the per-operator MACs overlay on a partition (low -> high).
MACS_GRADIENT = [{"stop": 0, "bgColor": "#f7fcf5"}, {"stop": 1, "bgColor": "#238b45"}]
#: LiteRT operators that only move data: a node's MACs are not theirs.
LAYOUT_OPS = frozenset({"TRANSPOSE", "RESHAPE"})
_LIBRARY_LABEL = {CMSIS_NN: "CPU CMSIS-NN", QUANTIZED: "CPU quantized", PORTABLE: "CPU portable"}


def _library(op_name: str) -> str:
    if op_name.startswith("cortex_m::"):
        return CMSIS_NN
    if op_name.startswith("quantized_decomposed::"):
        return QUANTIZED
    return PORTABLE


def _partition_of(delegate_data: bytes | None, order: int, names: list[str]) -> str:
    """The partition a delegate payload holds: its etforge header when it has one (host
    payloads), else the delegate calls' program order, which is the partitions' order."""
    from etforge.core.litert import payload

    if delegate_data is not None:
        try:
            return payload.unpack(delegate_data).partition
        except (ValueError, KeyError, json.JSONDecodeError):
            pass
    return names[order] if order < len(names) else f"delegate {order}"


def pte_node_data(pte: bytes, report: dict[str, Any]) -> dict[str, Any]:
    """Node data for ``model.pte`` as the PTE adapter shows it."""
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.schema import DelegateCall, KernelCall

    loaded = deserialize_pte_binary(pte)
    program = loaded.program
    names = [p.get("name") for p in report.get("partitions", [])]
    out: dict[str, Any] = {}
    for plan_index, plan in enumerate(program.execution_plan):
        graph = plan.name or f"ExecutionPlan_{plan_index}"
        results: dict[str, Any] = {}
        calls = 0
        for c, chain in enumerate(plan.chains):
            for i, instr in enumerate(chain.instructions):
                args = instr.instr_args
                node = f"{graph}_{c}_{i}"
                if isinstance(args, KernelCall):
                    lib = _library(plan.operators[args.op_index].name)
                    results[node] = {"value": _LIBRARY_LABEL[lib], "bgColor": CPU_COLOURS[lib]}
                elif isinstance(args, DelegateCall):
                    part = _partition_of(_delegate_bytes(loaded, plan, args.delegate_index), calls, names)
                    index = names.index(part) if part in names else calls
                    results[node] = {
                        "value": f"NPU {part}",
                        "bgColor": NPU_COLOURS[index % len(NPU_COLOURS)],
                    }
                    calls += 1
        out[graph] = {
            "name": "etforge placement",
            "results": results,
            "showExpandedSummaryOnGroupNode": True,
            "showLabelCountColumnsInChildrenStatsTable": True,
        }
    return out


def _delegate_bytes(loaded: Any, plan: Any, index: int) -> bytes | None:
    """The payload of ``plan.delegates[index]``: inline data or a segment of the file."""
    from executorch.exir.schema import DataLocation

    processed = plan.delegates[index].processed
    try:
        if processed.location == DataLocation.INLINE:
            return bytes(loaded.program.backend_delegate_data[processed.index].data)
        return bytes(loaded.segment_data[processed.index]) if hasattr(loaded, "segment_data") else None
    except (IndexError, AttributeError):
        return None


def tflite_node_data(tflite: bytes, partition: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    """Node data for one partition ``.tflite``: MACs of the Edge nodes each operator runs."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(tflite, 0))
    macs = {n["node"]: int(n.get("macs") or 0) for n in report.get("nodes", [])}
    out: dict[str, Any] = {}
    for s, sub in enumerate(model.subgraphs or []):
        graph = sub.name.decode() if sub.name else f"subgraph_{s}"
        ops = partition.get("ops", []) if s == 0 else []
        results = {str(op["index"]): {"value": 0} for op in ops}
        for node, count in macs.items():  # a node's MACs go to the ops that compute it
            mine = [op for op in ops if node in op["nodes"]]
            compute = [op for op in mine if op["op"] not in LAYOUT_OPS] or mine[:1]
            for op in compute:
                results[str(op["index"])]["value"] += count // len(compute)
        out[graph] = {"name": "MACs (etforge)", "results": results, "gradient": MACS_GRADIENT}
    return out


def write(out: Path, report: dict[str, Any], dest: Path) -> list[Path]:
    """``dest/model.pte.json`` and ``dest/<partition>.tflite.json``; returns the files written.

    Each file is written whole under a temporary name and renamed into place.
    """
    pte_path = out / "model.pte"
    if not pte_path.is_file():
        raise EtforgeError(f"{out}: no model.pte to describe")
    files: dict[str, dict[str, Any]] = {"model.pte.json": pte_node_data(pte_path.read_bytes(), report)}
    for part in report.get("partitions", []):
        tflite = out / "partitions" / f"{part['name']}.tflite"
        if tflite.is_file():
            files[f"{part['name']}.tflite.json"] = tflite_node_data(tflite.read_bytes(), part, report)
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in files.items():
        path = dest / name
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        tmp.replace(path)
        written.append(path)
    return written
