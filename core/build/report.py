"""The compile report: per-node placement and who decided, MACs, partitions, memory, stage times.

JSON for tools (``report.json``); ``summary_rows`` gives the table printed for people.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable
from typing import Any

from torch.export import ExportedProgram

from etforge import __version__
from etforge.core.build.pipeline import Partition
from etforge.core.build.session import CompileResult
from etforge.core.contracts.cpu_backend import CpuBackend
from etforge.core.front import signature
from etforge.core.graph.utils import node_op
from etforge.core.lower import boundaries, float_ops
from etforge.core.registry.manager import Registry
from etforge.core.serialize import npu_memory
from etforge.core.serialize.memory import memory_stats

REPORT_VERSION = 1


def _final_ops(program: ExportedProgram, cpu: CpuBackend) -> dict[int, str]:
    """debug handle -> the op that runs it after CPU lowering (a CPU backend kernel wins)."""
    out: dict[int, str] = {}
    for node in program.graph_module.graph.nodes:
        handle = node.meta.get("debug_handle")
        if node.op == "call_function" and isinstance(handle, int):
            op = node_op(node)
            # A folded q/dq (cortex_m.dequantize_per_tensor after quantized_linear) shares
            # its op's handle: it never stands for the op a backend kernel already runs.
            kept = handle in out and cpu.runs(out[handle]) and _is_qdq(op)
            if (cpu.runs(op) and not kept) or handle not in out:
                out[handle] = op
    return out


def _is_qdq(op: str) -> bool:
    return op.split(".")[1].startswith(("quantize_per_", "dequantize_per_")) if op.count(".") >= 2 else False


def npu_compiler_status(result: CompileResult, reg: Registry) -> tuple[str | None, bool, str]:
    """(compiler name, available, status) of the target's NPU compiler, worded for the case:
    no NPU at all, an NPU without a compiler (its partitions are host-only LiteRT), a
    compiler named by the target but not installed as a plugin, or the compiler's own word."""
    npu = result.target.npu
    if npu is None:
        return None, False, "no NPU on this target"
    if not npu.compiler:
        return (
            None,
            False,
            f"the {npu.family} NPU has no compiler plugin: its partitions are host-only LiteRT",
        )
    compiler = reg.npu_compilers.get(npu.compiler)
    if compiler is None:
        return (
            npu.compiler,
            False,
            f"no plugin provides NPU compiler {npu.compiler!r}: partitions are host-only",
        )
    available, status = compiler.available()
    return npu.compiler, bool(available), status


def _npu_section(result: CompileResult) -> dict[str, Any]:
    """The NPU partitions' working memory and, for each host-only one, what it needs where the
    device runs it instead of the NPU (the target's ``NpuSpec.fallback_arena``, beside it)."""
    section = npu_memory.report_section(npu_memory.plan_result(result))
    npu = result.target.npu
    if npu is None or npu.fallback_arena is None or not result.partitions:
        return section
    for entry, p in zip(section["npu_partitions"], result.partitions, strict=True):
        if p.host_only:
            entry["fallback_arena_bytes"] = npu.fallback_arena(p.converted.tflite)
    section["fallback_arena_source"] = npu.fallback_arena_note
    return section


def build_report(result: CompileResult, reg: Registry, model: str) -> dict[str, Any]:
    """``report.json``: the target, every node's placement and why, the partitions, the CPU
    ops, memory, timings and the fallbacks taken (``docs/report.md``)."""
    cpu = reg.cpu_backend(result.target)
    nodes = _node_rows(result, cpu)
    total = sum(n["macs"] for n in nodes)
    on_npu = sum(n["macs"] for n in nodes if n["placement"] == "npu")
    compiler_name, available, status = npu_compiler_status(result, reg)
    partitions = [_partition_row(p) for p in result.partitions]
    cpu_ops = Counter(
        node_op(n)
        for n in result.host_program.graph_module.graph.nodes
        if n.op == "call_function" and "delegate" not in node_op(n)
    )
    return {
        "report_version": REPORT_VERSION,
        "etforge_version": __version__,
        "model": model,
        "target": result.target.name,
        "cpu": result.options.get("cpu") or result.target.cpu,
        "isa": cpu.isa(result.target, result.options),
        "cpu_backend": cpu.name,
        "options": {k: list(v) if isinstance(v, tuple) else v for k, v in sorted(result.options.items())},
        "quantized": result.quantized,
        "npu_compiler": {"name": compiler_name, "available": available, "status": status},
        # Device figures the decisions used; "assumption": true marks values that are not vendor data.
        "npu_figures": result.target.npu.figures() if result.target.npu is not None else {},
        "host_only": any(p.host_only for p in result.partitions),
        "has_npu": result.target.npu is not None,
        "inputs": [
            {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
            # an integer input's [min, max] over example and calibration: verify samples it
            | ({"range": r} if (r := _range(result, i)) is not None else {})
            for i, t in enumerate(_example(result))
        ],
        # the pytree leaves of what forward returns, in the .pte's output order (core.front.signature)
        "outputs": signature.describe_outputs(result.host_program),
        # every stage and attempt: a second build round's "lower (round 2)", and inside the last
        # lowering its parts ("lower: delegate (early attempt)", "lower: cpu_lowering")
        "stages": {k: round(v, 4) for k, v in result.stage_seconds.items()}
        | {f"lower: {k}": round(v, 4) for k, v in result.lower_breakdown.items()},
        # "early" | "classic" and why; "fallback": the early path was tried and could not be exact.
        "lowering": dict(result.lowering),
        "nodes": nodes,
        "macs": {"total": total, "npu": on_npu, "npu_share": (on_npu / total) if total else 0.0},
        "partitions": partitions,
        "cpu_ops": dict(sorted(cpu_ops.items())),
        "cpu_layout_conversions": boundaries.layout_conversions(result.host_program, cpu.layout_ops),
        "memory": {
            **memory_stats(result.executorch).as_dict(),
            "pte_bytes": len(result.pte),
            **_npu_section(result),
        },
        "pte_sha256": hashlib.sha256(result.pte).hexdigest(),
        "notes": list(result.notes),
        # the edited float model (rewrites, folds, quantizer passes) against the exported one on
        # the first calibration batch (core.build.equivalence); null: nothing edited it
        "float_equivalence": result.equivalence.as_dict() if result.equivalence is not None else None,
        # second-best paths taken (stage, what, where, why): core.common.fallbacks; --strict refuses them
        "fallbacks": [f.as_dict() for f in result.fallbacks],
        "io_quant": _io_quant(result.host_program),
        # ExecuTorch instruction index -> the debug handle of the node it runs (the emitter's
        # map): a device profile per instruction maps onto nodes[] and partitions with it
        "instruction_handles": _instruction_handles(result),
        # what the int8 ranges were observed on; example_only: no calibration data was given
        "calibration": {
            "samples": result.calibration_samples,
            "example_only": result.calibrated_on_example,
        },
    }


def _node_rows(result: CompileResult, cpu: CpuBackend) -> list[dict[str, Any]]:
    """One row per compute node: where it runs, who decided and why, what it became (the
    LiteRT ops of its partition, or the CPU op that runs it)."""
    final = _final_ops(result.host_program, cpu)
    # a node the CPU lowering kept (same name) runs as itself: decomposed nodes share a handle
    kept = {
        n.name: node_op(n)
        for n in result.host_program.graph_module.graph.nodes
        if n.op == "call_function" and not _is_qdq(node_op(n))
    }
    litert_ops: dict[str, list[dict[str, Any]]] = {}
    for p in result.partitions:
        for index, names in p.converted.op_nodes.items():
            for name in names:
                litert_ops.setdefault(name, []).append(
                    {"partition": p.name, "index": index, "op": p.converted.operators[index]}
                )
    floats = float_ops.by_edge_node(result.host_program, result.decisions) if result.quantized else {}
    library = _library_finder(result.host_program, cpu)
    nodes = []
    for d in result.decisions:
        placement = "npu" if d.npu else cpu.placement
        cpu_op = (
            None if d.npu else kept.get(d.node) or (final.get(d.handle) if d.handle is not None else None)
        )
        if not d.npu and cpu.kernel_namespaces and not cpu.runs(cpu_op or ""):
            placement = "portable"  # none of the backend's kernels took it
        float_ran = floats.get(d.node, [])
        nodes.append(
            {
                "node": d.node,
                "op": d.op,
                "placement": placement,
                "converter": d.converter,
                "plugin": d.plugin,
                "reason": d.reason or None,
                "partition": d.partition,
                "macs": d.macs,
                "debug_handle": d.handle,
                "litert_ops": litert_ops.get(d.node, []),
                "cpu_op": cpu_op,
                # the kernel library that runs it on the CPU (CMSIS-NN, ExecuTorch quantized, portable)
                "kernel": library(cpu_op) if cpu_op else None,
                # a quantized program's node that runs float ops on the CPU (a recorded fallback)
                "float": bool(float_ran),
                "float_ops": float_ran,
                "fused_into": None,
                "inputs": list(d.inputs),
                "shape": list(d.shape) if d.shape is not None else None,
                "dtype": d.dtype,
                "bytes": d.bytes,
            }
        )
    _mark_fused(nodes)
    return nodes


def _mark_fused(nodes: list[dict[str, Any]]) -> None:
    """A CPU node no op of the program runs (a ReLU the producer's kernel clamps in its
    output) is ``fused_into`` its producer: it runs where, and on the kernel, the producer does."""
    rows = {n["node"]: n for n in nodes}
    for n in nodes:
        if n["placement"] == "npu" or n["cpu_op"] or not n["inputs"]:
            continue
        producer = rows.get(n["inputs"][0])
        while producer is not None and producer.get("fused_into"):
            producer = rows.get(producer["fused_into"])
        if producer is None or producer["placement"] == "npu" or not producer["cpu_op"]:
            continue
        n["fused_into"] = producer["node"]
        n["kernel"] = producer["kernel"]
        n["placement"] = producer["placement"]


def _instruction_handles(result: CompileResult) -> dict[str, int | None]:
    """The ``forward`` plan's instruction index -> debug handle (``debug_handle_map``)."""
    try:
        table = (result.executorch.debug_handle_map or {}).get("forward", {})
    except Exception:  # an emitter without the map: the profile says it cannot attribute
        return {}
    out: dict[str, int | None] = {}
    for index, handle in sorted(table.items()):
        first = handle[0] if isinstance(handle, (list, tuple)) and handle else handle
        out[str(index)] = int(first) if isinstance(first, int) else None
    return out


def _library_finder(program: ExportedProgram, cpu: CpuBackend) -> Callable[[str], str | None]:
    """CPU op name -> the title of the first kernel library of ``cpu`` that provides it."""
    from etforge.core.lower import kernel_check

    libraries = kernel_check.libraries_for(cpu)
    targets = {node_op(n): n.target for n in program.graph_module.graph.nodes if n.op == "call_function"}
    found: dict[str, str | None] = {}

    def library(op: str) -> str | None:
        if op not in found:
            found[op] = kernel_check.library_of(targets.get(op), libraries)
        return found[op]

    return library


def _partition_row(p: Partition) -> dict[str, Any]:
    """One NPU partition: its files and sizes, LiteRT operators and boundary dim orders."""
    counts = Counter(p.converted.operators)
    return {
        "name": p.name,
        "format": p.payload.format,
        "host_only": p.host_only,
        "tflite": f"partitions/{p.name}.tflite",
        "tflite_bytes": len(p.converted.tflite),
        "payload_bytes": len(p.processed),
        "litert_ops": len(p.converted.operators),
        "operators": dict(sorted(counts.items())),
        "boundary_transposes": counts.get("TRANSPOSE", 0),
        "input_dim_orders": [list(d) for d in p.converted.input_dim_orders],
        "output_dim_orders": [list(d) for d in p.converted.output_dim_orders],
        "kernel_selection": p.payload.kernel_selection is not None,
        "ops": [
            {
                "index": i,
                "op": op,
                "nodes": p.converted.op_nodes.get(i, []),
                "debug_handles": p.converted.debug_map.get(i, []),
            }
            for i, op in enumerate(p.converted.operators)
        ],
    }


def _io_quant(program: ExportedProgram) -> dict[str, list[dict[str, Any] | None]]:
    """Quantization of the program's user inputs (first quantize) and outputs (last dequantize)."""

    def params(node: Any) -> dict[str, Any] | None:
        if node is None or len(node.args) < 3 or not isinstance(node.args[1], float):
            return None
        return {"scale": float(node.args[1]), "zero_point": int(node.args[2])}

    graph = program.graph_module.graph
    user_inputs = set(program.graph_signature.user_inputs)
    inputs = []
    for node in graph.nodes:
        if node.op == "placeholder" and node.name in user_inputs:
            q = next((u for u in node.users if _named(u, "quantize_per_tensor")), None)
            inputs.append(params(q))
    out = next(n for n in graph.nodes if n.op == "output")
    outputs = []
    for arg in out.args[0]:
        is_dq = (
            hasattr(arg, "op")
            and arg.op == "call_function"
            and node_op(arg).split(".")[-2] == "dequantize_per_tensor"
        )
        outputs.append(params(arg) if is_dq else None)
    return {"inputs": inputs, "outputs": outputs}


def _named(node: Any, op: str) -> bool:
    """``node`` calls ``<namespace>.<op>.<overload>`` (any namespace: q/dq ops or a CPU backend's)."""
    parts = node_op(node).split(".") if getattr(node, "op", None) == "call_function" else []
    return len(parts) == 3 and parts[1] == op


def _range(result: CompileResult, i: int) -> list[int] | None:
    ranges = getattr(result, "input_ranges", None) or []
    return ranges[i] if i < len(ranges) else None


def _example(result: CompileResult) -> tuple[Any, ...]:
    ex = result.float_program.example_inputs
    return tuple(ex[0]) if ex else ()


def summary_rows(report: dict[str, Any]) -> list[tuple[str, ...]]:
    rows = []
    for n in report["nodes"]:
        who = f"{n['converter']} ({n['plugin']})" if n["converter"] else "-"
        rows.append(
            (
                n["node"],
                n["op"],
                n["placement"],
                n["partition"] or "-",
                who,
                str(n["macs"]),
                n["reason"] or "",
            )
        )
    return rows
