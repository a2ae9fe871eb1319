"""The lowering driver: early or classic, decided here and recorded (``lowering``, fallbacks).

The early path delegates NPU partitions on the quantized ATen program and sends only the rest
through ``to_edge`` (``core/lower/early.py``); the classic path is ExecuTorch's own single pass
(``to_edge_transform_and_lower``) and the reference. Then the CPU backend lowers what is left.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any

import torch
from executorch.exir import (
    EdgeCompileConfig,
    EdgeProgramManager,
    to_edge,
    to_edge_transform_and_lower,
)
from torch.export import ExportedProgram

from etforge.core.common import fallbacks
from etforge.core.common.errors import first_line
from etforge.core.contracts.npu_compiler import NpuPayload
from etforge.core.contracts.target import TargetSpec
from etforge.core.graph.dequant_copies import split_shared_dequantizes, split_shared_dequantizes_pass
from etforge.core.graph.utils import clone_program
from etforge.core.litert.convert import Converted
from etforge.core.lower import delegate_stubs
from etforge.core.lower import npu_backend as backend
from etforge.core.lower.partitioner import EtforgePartitioner
from etforge.core.registry.manager import Registry, registry


@dataclass
class Partition:
    """One NPU partition as lowered: its LiteRT model and the delegate payload."""

    name: str
    converted: Converted
    payload: NpuPayload
    processed: bytes

    @property
    def host_only(self) -> bool:
        return self.payload.host_only


def edge_config() -> EdgeCompileConfig:
    return EdgeCompileConfig(_check_ir_validity=False)


def lower(
    ep: ExportedProgram,
    target: TargetSpec,
    options: dict[str, Any] | None = None,
    reg: Registry | None = None,
    early: bool = True,
    lowering: dict[str, Any] | None = None,
) -> tuple[EdgeProgramManager, EtforgePartitioner, list[Partition], dict[str, float]]:
    """NPU delegation, then the CPU backend's lowering.

    With ``early`` (the default), NPU partitions are delegated on the quantized ATen program and
    only the rest goes through ``to_edge`` (``core/lower/early.py``); the classic path, ExecuTorch's
    single pass over everything, is the fallback and the reference (``early=False``).
    Returns the Edge program, the partitioner (its decisions), the partitions and stage times;
    ``lowering`` (when given) gets the path taken and why (``path``, ``reason``, ``fallback``:
    the early path was tried and could not be exact).
    """
    reg = reg or registry()
    options = {**target.option_defaults(), **(options or {})}
    cpu = reg.cpu_backend(target)
    config = cpu.edge_compile_config() or edge_config()
    t0 = time.perf_counter()
    # Delegates carry shape stubs from the early path's to_edge to the end of the CPU
    # lowering (delegate_stubs): the scope restores every program that held one.
    with delegate_stubs.scope() as stubs:
        edge, partitioner, lowered, why = _delegate(ep, target, options, reg, config, early, stubs)
        if lowering is not None:
            lowering.update(why)
        t1 = time.perf_counter()
        parts = [Partition(x.name, x.converted, x.payload, x.processed) for x in lowered]
        from etforge.core.litert.builder import check_loads

        for part in parts:  # before anything is serialized or written: every partition loads in LiteRT
            c = part.converted
            check_loads(part.name, c.tflite, list(c.operators), dict(c.op_nodes))
        _set_runtime_backend_ids(edge.exported_program(), parts)
        host = edge.exported_program()
        stubs.stub(host)
        cpu_ep = cpu.lower(host, target, options)
        stubs.track(cpu_ep)
    if drop_dead_constants(cpu_ep) or cpu_ep is not host:
        edge = EdgeProgramManager({"forward": cpu_ep}, compile_config=config)
    t2 = time.perf_counter()
    times = {f"delegate ({a['path']} attempt)": a["seconds"] for a in why.get("attempts", [])[:-1]}
    times[f"delegate ({why['path']})"] = t1 - t0 - sum(times.values())
    return edge, partitioner, parts, {**times, "cpu_lowering": t2 - t1}


def delegate_npu(
    ep: ExportedProgram,
    target: TargetSpec,
    options: dict[str, Any] | None = None,
    reg: Registry | None = None,
) -> tuple[ExportedProgram, list[Partition], dict[str, Any]]:
    """Only the NPU delegation, the early path on a float program too (the classic path where
    it cannot be exact), and no CPU lowering: the program verify's float check runs (it
    compares each NPU op in float with its Edge op; the ops left on the CPU run as Edge ops).
    Returns the delegated program, its partitions and the path taken with why."""
    reg = reg or registry()
    options = {**target.option_defaults(), **(options or {})}
    config = reg.cpu_backend(target).edge_compile_config() or edge_config()
    with delegate_stubs.scope() as stubs:
        edge, _, lowered, why = _delegate(ep, target, options, reg, config, True, stubs, any_program=True)
        program = edge.exported_program()
        stubs.track(program)
    return program, [Partition(x.name, x.converted, x.payload, x.processed) for x in lowered], why


def _delegate(
    ep: ExportedProgram,
    target: TargetSpec,
    options: dict[str, Any],
    reg: Registry,
    config: EdgeCompileConfig,
    early: bool,
    stubs: delegate_stubs.StubScope,
    any_program: bool = False,
) -> tuple[EdgeProgramManager, EtforgePartitioner, list[backend.Lowered], dict[str, Any]]:
    """The NPU delegation: the early path when asked for and exact, else the classic path.

    Returns the Edge program, the partitioner that decided, the partitions in graph order
    and the path taken with why (``path``, ``reason``, ``fallback``). Taking the classic path
    after trying the early one is a recorded fallback.
    """
    # The lowering hands preprocess this registry and collects the partitions it converts.
    with backend.lowering(reg, options, target) as low:
        why: dict[str, Any] = {"path": "classic", "reason": "", "fallback": False}
        # Early delegation is proven on quantized programs (what the NPU runs); a float program
        # (--float, the litert target) lowers the classic way, here and when verify rebuilds it.
        if not early:
            why["reason"] = "the classic path was asked for (early=False)"
        elif not _quantized(ep) and not any_program:
            why["reason"] = "a float program: early delegation is proven on quantized programs only"
        else:
            partitioner = _partitioner(ep, target, options, reg, low)
            start = time.perf_counter()
            edge = _lower_early(ep, target, options, reg, partitioner, config, why, stubs)
            early_seconds = time.perf_counter() - start
            if edge is not None:
                why = {
                    **why,
                    "path": "early",
                    "reason": "NPU partitions delegated on the quantized ATen program"
                    if target.npu is not None
                    else f"{target.name} has no NPU: the program decomposed node by node, then to_edge's passes",
                }
                return edge, partitioner, low.in_tag_order(), why
            why["fallback"] = True
            why.pop("edge_passes_skipped", None)  # the early attempt's: the classic path runs them all
            # every attempt and its time: the report's stages name the early one too
            why["attempts"] = [{"path": "early", "seconds": round(early_seconds, 4), "result": why["reason"]}]
            # the attempt's time is in lowering.attempts and the stages: fallbacks compare equal across runs
            fallbacks.record("lower", "lowered the classic way (slower)", "", why["reason"])
        low.partitions.clear()
        partitioner = _partitioner(ep, target, options, reg, low)
        start = time.perf_counter()
        edge = _lower_classic(ep, partitioner, config, low)
        if why.get("attempts"):
            why["attempts"].append(
                {"path": "classic", "seconds": round(time.perf_counter() - start, 4), "result": "lowered"}
            )
        return edge, partitioner, low.in_tag_order(), why


def _partitioner(
    ep: ExportedProgram, target: TargetSpec, options: dict[str, Any], reg: Registry, low: backend.Lowering
) -> EtforgePartitioner:
    partitioner = EtforgePartitioner(target, options, reg, lowering=low)
    partitioner.remember_constants(ep)  # it is handed fake copies of the program
    return partitioner


def _quantized(ep: ExportedProgram) -> bool:
    from etforge.core.graph.utils import is_quantize

    return any(is_quantize(n) for n in ep.graph_module.graph.nodes)


#: Edge passes of the classic path, before the partitioner sees the graph (it may not edit it).
_TRANSFORMS = (split_shared_dequantizes_pass,)


def _transform_and_lower(
    ep: ExportedProgram, partitioner: EtforgePartitioner, config: EdgeCompileConfig
) -> EdgeProgramManager:
    return to_edge_transform_and_lower(
        ep, transform_passes=list(_TRANSFORMS), partitioner=[partitioner], compile_config=config
    )


def _lower_classic(
    ep: ExportedProgram, partitioner: EtforgePartitioner, config: EdgeCompileConfig, low: backend.Lowering
) -> EdgeProgramManager:
    """ExecuTorch's own flow: decompose and run the Edge passes on everything, then delegate."""
    if getattr(config, "preserve_ops", None):
        # A CPU backend that keeps ATen ops whole (CMSIS-NN's linear ...) needs to_edge's
        # preserve_ops, which to_edge_transform_and_lower ignores once a partitioner is
        # given: decompose once with both sets preserved, then delegate.
        config = dataclasses.replace(config, preserve_ops=_kept_whole(config, partitioner))
        edge = to_edge(ep, compile_config=config).transform(list(_TRANSFORMS))
        return edge.to_backend(partitioner)
    try:
        return _transform_and_lower(ep, partitioner, config)
    except RuntimeError as exc:
        # ExecuTorch refuses a program where an op kept whole (ops_to_not_decompose) was not
        # delegated. The partitioner's own decisions say whether that happened (a
        # partition-level refusal such as min_partition_ops): then lower again with
        # everything decomposed, and converters of the decomposed forms (addmm, permute ...)
        # take what the NPU can run. Any other error is the compile's.
        left = _kept_whole_on_cpu(partitioner)
        if not left:
            raise
        fallbacks.record(
            "lower",
            "re-lowered with every op decomposed",
            "",
            f"an op kept whole for the NPU stayed on the CPU ({first_line(exc)})",
        )
        low.partitions.clear()
        partitioner.preserve = False
        return _transform_and_lower(ep, partitioner, config)


def _kept_whole_on_cpu(partitioner: EtforgePartitioner) -> list[str]:
    """Nodes of an op kept whole for the NPU that the last partitioning left on the CPU."""
    if not partitioner.preserve:
        return []
    kept = set(partitioner.preserved_op_names())
    return [d.node for d in partitioner.decisions if not d.npu and d.op in kept]


def _kept_whole(config: EdgeCompileConfig, partitioner: EtforgePartitioner) -> list[Any]:
    keep = list(config.preserve_ops) + [_aten_op(n) for n in partitioner.preserved_op_names()]
    return list(dict.fromkeys(k for k in keep if k is not None))


def _lower_early(
    ep: ExportedProgram,
    target: TargetSpec,
    options: dict[str, Any],
    reg: Registry,
    partitioner: EtforgePartitioner,
    config: EdgeCompileConfig,
    why: dict[str, Any],
    stubs: delegate_stubs.StubScope,
) -> EdgeProgramManager | None:
    """Delegate on the quantized ATen program, then ``to_edge`` the rest (``core/lower/early.py``).

    On a target without an NPU nothing is delegated: the node-by-node decomposition replaces
    ``to_edge``'s ``run_decompositions`` (which re-traces the whole program), same bytes.

    ``None`` when the early path cannot be exact for this program: the caller lowers classically
    (``why["reason"]`` says which node stopped it, and how).
    The delegates keep their shape stubs (``core/lower/delegate_stubs.py``) for the CPU lowering,
    until the caller's ``stubs`` scope ends.
    """
    from etforge.core.lower import early

    try:
        delegated, handles = _delegate_aten(ep, target, partitioner, config)
        if target.npu is None:  # nothing to delegate: the decomposition alone is the gain
            edge = _to_edge_decomposed(delegated, config, why)
            # Every node's row in the report (where it runs, MACs, bytes): decided on a copy,
            # since deciding marks node meta the program must not carry.
            partitioner.decide(clone_program(edge.exported_program()))
            return edge
    except early.NotExact as exc:
        why["reason"] = f"the early path cannot be exact: {exc}"
        return None
    stubs.stub(delegated)
    edge = _to_edge_decomposed(delegated, config, why)
    stubs.track(edge.exported_program())
    early.renumber(edge.exported_program().graph_module, handles)
    # The remainder's Edge form must leave the NPU nothing: else the classic path would
    # have delegated more, and it is the reference.
    probe = EtforgePartitioner(target, options, reg)
    probed = probe.partition(clone_program(edge.exported_program()))
    if probed.partition_tags:
        taken = [
            n.name
            for n in probed.tagged_exported_program.graph_module.graph.nodes
            if "delegation_tag" in n.meta
        ]
        why["reason"] = (
            f"the NPU takes nodes of the remainder's Edge form ({', '.join(taken[:4])}"
            + (" …" if len(taken) > 4 else "")
            + "), which the classic path delegates"
        )
        return None
    return edge


def _delegate_aten(
    ep: ExportedProgram, target: TargetSpec, partitioner: EtforgePartitioner, config: EdgeCompileConfig
) -> tuple[ExportedProgram, dict[str, int]]:
    """The early path's work on the quantized ATen program (a copy): the node forms ``to_edge``
    would give, NPU partitions delegated, what the NPU left decomposed as ``to_edge`` would.
    Returns the program and the debug handles by ancestor (for ``early.renumber``); on a
    target without an NPU, the decomposed program. Raises ``early.NotExact``."""
    from executorch.exir.backend.backend_api import to_backend
    from executorch.exir.tracer import _default_decomposition_table

    from etforge.core.lower import early

    cpu_keep = set(getattr(config, "preserve_ops", None) or [])
    if target.npu is None:
        keep = cpu_keep
    elif cpu_keep:
        keep = set(_kept_whole(config, partitioner))
    else:
        keep = set(partitioner.ops_to_not_decompose(ep)[0])
    work = clone_program(ep)
    full = _decomposition_dict(
        _default_decomposition_table(), {n.target for n in work.graph_module.graph.nodes}
    )
    early.prepare(work, keep, {k: v for k, v in full.items() if k not in keep})
    split_shared_dequantizes(work.graph_module)
    if target.npu is None:
        return work, {}
    handles = early.handles_by_ancestor(work.graph_module)
    delegated = to_backend(work, partitioner)
    # Ops kept whole for the NPU that it did not take are decomposed, as to_edge would.
    early.decompose(delegated, cpu_keep, {k: v for k, v in full.items() if k not in cpu_keep})
    return delegated, handles


def delegate_early(
    ep: ExportedProgram,
    target: TargetSpec,
    options: dict[str, Any] | None = None,
    reg: Registry | None = None,
) -> tuple[ExportedProgram | None, str]:
    """The early path's NPU delegation alone, for a pipeline whose own ``to_edge`` lowers the
    rest (ExecuTorch's recipe stages: ``etforge.recipes``). ``(program, "")``, or ``(None, why)``
    when there is nothing to delegate early or it cannot be exact (lower the classic way)."""
    from etforge.core.lower import early

    if target.npu is None:
        return None, f"{target.name} has no NPU"
    if not _quantized(ep):
        return None, "a float program: early delegation is proven on quantized programs only"
    reg = reg or registry()
    options = {**target.option_defaults(), **(options or {})}
    config = reg.cpu_backend(target).edge_compile_config() or edge_config()
    with backend.lowering(reg, options, target) as low:
        partitioner = _partitioner(ep, target, options, reg, low)
        try:
            delegated, _ = _delegate_aten(ep, target, partitioner, config)
        except early.NotExact as exc:
            return None, f"the early path cannot be exact: {exc}"
    return delegated, ""


def _decomposition_dict(table: Any, ops: set[Any]) -> dict[Any, Any]:
    """``table`` (torch's ``CustomDecompTable``) as a dict, for the ops a graph can reach.

    Reading the table materializes it: it collects the composite ops of every namespace
    (about 0.3 s on every call). Its ATen part is already there; of the other namespaces only
    the graph's own ops can matter, since dispatch decomposes any composite op a decomposition
    emits. Without the private fields, the table is read whole."""
    raw, deleted = getattr(table, "decomp_table", None), getattr(table, "deleted_custom_ops", None)
    try:
        from torch._export.utils import _get_decomp_for_cia, _is_preservable_cia_op
    except ImportError:
        raw = None
    if not isinstance(raw, dict) or not isinstance(deleted, set):
        return dict(table.items())
    out = dict(raw)
    for op in ops:
        if (
            isinstance(op, torch._ops.OpOverload)
            and op.namespace != "aten"
            and op not in out
            and op not in deleted
            and _is_preservable_cia_op(op)
        ):
            out[op] = _get_decomp_for_cia(op)
    return out


def _to_edge_decomposed(
    ep: ExportedProgram, config: EdgeCompileConfig, why: dict[str, Any]
) -> EdgeProgramManager:
    """``to_edge`` of a program whose nodes ``early.prepare`` already decomposed with its table.

    ``to_edge`` would run ``run_decompositions`` again, which re-traces the program and, on
    every call, collects the composite ops of every namespace (seconds on a small model) to
    change nothing here. The Edge passes run as ``to_edge`` runs them, less the re-tracing ones
    with nothing to do (``core/lower/edge_passes.py``), which ``why`` lists."""
    from etforge.core.lower.edge_passes import edge_program

    preserve = list(getattr(config, "preserve_ops", None) or [])
    program, skipped = edge_program(config, ep, preserve)
    why["edge_passes_skipped"] = skipped
    return EdgeProgramManager({"forward": program}, None, config)


def drop_dead_constants(ep: ExportedProgram) -> int:
    """Remove constant inputs no node reads; returns how many.

    ExecuTorch drops unused *parameters* only; a pass that replaces a weight (Cortex-M's
    NHWC copies) leaves the old buffer, and the emitter still serializes it: flash for
    nothing (ds_cnn on Cortex-M: a quarter of its .pte).
    """
    from torch.export.graph_signature import InputKind

    kinds = {InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR}
    mutated = set(ep.graph_signature.buffers_to_mutate.values())
    nodes = {n.name: n for n in ep.graph_module.graph.nodes if n.op == "placeholder"}
    dead = [
        spec
        for spec in ep.graph_signature.input_specs
        if spec.kind in kinds
        and spec.target not in mutated
        and getattr(spec.arg, "name", None) in nodes
        and not nodes[spec.arg.name].users
    ]
    for spec in dead:
        ep.graph_signature.input_specs.remove(spec)
        ep.graph_module.graph.erase_node(nodes[spec.arg.name])
    kept = {s.target for s in ep.graph_signature.input_specs}
    for spec in dead:
        if spec.target not in kept:  # a tensor goes only when no remaining input reads it
            ep.state_dict.pop(spec.target, None)
            ep.constants.pop(spec.target, None)
    if dead:
        ep.graph_module.recompile()
    return len(dead)


def _aten_op(name: str) -> Any:
    ns, op, overload = name.split(".")
    return getattr(getattr(getattr(torch.ops, ns), op, None), overload, None)


def _set_runtime_backend_ids(ep: ExportedProgram, parts: list[Partition]) -> None:
    """A device payload is delegated to the backend id its device runtime registers."""
    ids = {p.processed: p.payload.runtime_backend_id for p in parts if p.payload.runtime_backend_id}
    if not ids:
        return
    for node in ep.graph_module.graph.nodes:
        if node.op == "get_attr":
            mod = getattr(ep.graph_module, str(node.target), None)
            processed = getattr(mod, "processed_bytes", None)
            if processed is not None and bytes(processed) in ids:
                mod._backend_id = ids[bytes(processed)]
