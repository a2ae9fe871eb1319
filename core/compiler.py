"""The whole compile: export -> quantize -> lower (NPU) -> CPU lowering -> .pte, with stage times.

Everything heavy is ExecuTorch's: one ``to_edge_transform_and_lower`` (decomposes once,
runs our partitioner and backend), the CPU backend's own passes, ``to_executorch``.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from executorch.exir import EdgeProgramManager, ExecutorchProgramManager, to_edge, to_edge_transform_and_lower
from torch.export import ExportedProgram

from etforge.core import backend
from etforge.core.errors import EtforgeError
from etforge.core.partitioner import Decision, EtforgePartitioner
from etforge.core.pipeline import Partition, edge_config
from etforge.core.plugin_manager import Registry, registry
from etforge.core.quantize import ComposedQuantizer, convert, prepare
from etforge.core.target import TargetSpec

Progress = Callable[[str], contextlib.AbstractContextManager[Any]]


@dataclass
class CompileResult:
    target: TargetSpec
    options: dict[str, Any]
    quantized: bool
    float_program: ExportedProgram
    quantized_program: ExportedProgram | None
    edge: EdgeProgramManager
    host_program: ExportedProgram  # the lowered Edge program, runnable on the host
    executorch: ExecutorchProgramManager
    pte: bytes
    partitions: list[Partition]
    decisions: list[Decision]
    stage_seconds: dict[str, float] = field(default_factory=dict)
    lower_breakdown: dict[str, float] = field(default_factory=dict)


@contextlib.contextmanager
def _no_progress(stage: str) -> Iterator[None]:
    yield


def export_program(module: torch.nn.Module, example: tuple[torch.Tensor, ...], what: str) -> ExportedProgram:
    try:
        return torch.export.export(module.eval(), example, strict=False)
    except Exception as exc:
        lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()][:6]
        raise EtforgeError(
            f"torch.export rejected {what}: {type(exc).__name__}: " + "\n  ".join(lines)
        ) from None


def quantizer_for(target: TargetSpec, options: dict[str, Any], reg: Registry) -> Any:
    """The target's NPU rules first, then its CPU backend's quantizer for what they left."""
    rules = reg.rules_for(target)
    ours = ComposedQuantizer(rules) if rules else None
    cpu_q = reg.cpu_backend(target).quantizer(target, options)
    if ours is None and cpu_q is None:
        raise EtforgeError(f"target {target.name!r} composes no quantizer (no rules, no CPU quantizer)")
    if ours is None:
        return cpu_q
    if cpu_q is None:
        return ours
    return StackedQuantizer(ours, cpu_q)


class StackedQuantizer(ComposedQuantizer.__mro__[1]):  # torchao's Quantizer base
    """``first`` annotates; ``fill`` annotates only the nodes ``first`` left alone.

    (torchao's ComposableQuantizer refuses a later quantizer touching earlier annotations;
    here the NPU rules own their nodes and the CPU quantizer fills the gaps.)
    """

    def __init__(self, first: Any, fill: Any) -> None:
        super().__init__()
        self.first, self.fill = first, fill

    def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        return self.fill.transform_for_annotation(self.first.transform_for_annotation(model))

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        key = "quantization_annotation"
        self.first.annotate(model)
        owned = {n: n.meta.pop(key) for n in list(model.graph.nodes) if key in n.meta}
        self.fill.annotate(model)
        for node, ann in owned.items():
            node.meta[key] = ann
        return model

    def validate(self, model: torch.fx.GraphModule) -> None:
        return None


def quantize_program(
    ep: ExportedProgram,
    target: TargetSpec,
    options: dict[str, Any],
    calibration: Sequence[tuple[torch.Tensor, ...]],
    reg: Registry,
) -> ExportedProgram:
    example = tuple(ep.example_inputs[0])
    gm = prepare(ep.module(check_guards=False), quantizer_for(target, options, reg))
    with torch.no_grad():
        for batch in calibration:
            gm(*batch)
    gm = convert(gm)
    return torch.export.export(gm, example, strict=False)


def lower_program(
    ep: ExportedProgram, target: TargetSpec, options: dict[str, Any], reg: Registry
) -> tuple[EdgeProgramManager, EtforgePartitioner, list[Partition], dict[str, float]]:
    """NPU delegation in ExecuTorch's single pass, then the CPU backend's lowering."""
    cpu = reg.cpu_backend(target)
    config = cpu.edge_compile_config() or edge_config()
    partitioner = EtforgePartitioner(target, options, reg)
    start = len(backend.CONVERTED)
    t0 = time.perf_counter()
    try:
        if getattr(config, "preserve_ops", None):
            # A CPU backend that keeps ATen ops whole (CMSIS-NN's linear ...) needs to_edge's
            # preserve_ops, which to_edge_transform_and_lower ignores once a partitioner is
            # given: decompose once with both sets preserved, then delegate.
            keep = list(config.preserve_ops) + [_aten_op(n) for n in partitioner.preserved_op_names()]
            config = dataclasses.replace(
                config, preserve_ops=list(dict.fromkeys(k for k in keep if k is not None))
            )
            edge = to_edge(ep, compile_config=config).to_backend(partitioner)
        else:
            try:
                edge = to_edge_transform_and_lower(ep, partitioner=[partitioner], compile_config=config)
            except RuntimeError as exc:
                if "was not decomposed or delegated" not in str(exc):
                    raise
                # A kept-whole node ended up off the NPU (a partition-level refusal such as
                # min_partition_ops): redo with everything decomposed; converters of the
                # decomposed forms (addmm, permute ...) take what the NPU can run.
                del backend.CONVERTED[start:]
                partitioner.preserve = False
                edge = to_edge_transform_and_lower(ep, partitioner=[partitioner], compile_config=config)
    finally:
        lowered = backend.CONVERTED[start:]
        del backend.CONVERTED[start:]
    t1 = time.perf_counter()
    parts = [Partition(x.name, x.converted, x.payload, x.processed) for x in lowered]
    _set_runtime_backend_ids(edge.exported_program(), parts)
    cpu_ep = cpu.lower(edge.exported_program(), target, options)
    if cpu_ep is not edge.exported_program():
        edge = EdgeProgramManager({"forward": cpu_ep}, compile_config=config)
    t2 = time.perf_counter()
    return edge, partitioner, parts, {"to_edge_transform_and_lower": t1 - t0, "cpu_lowering": t2 - t1}


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


def clone_program(ep: ExportedProgram) -> ExportedProgram:
    """A structural copy (new graph, shared tensors): ``to_executorch`` rewrites graphs in place,
    and the lowered Edge program stays runnable on the host for ``verify``."""
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(ep.graph_module.graph, {}))
    gm = torch.fx.GraphModule(ep.graph_module, graph)
    return ExportedProgram(
        root=gm,
        graph=gm.graph,
        graph_signature=copy.deepcopy(ep.graph_signature),
        state_dict=ep.state_dict,
        range_constraints=ep.range_constraints,
        module_call_graph=copy.deepcopy(ep.module_call_graph),
        example_inputs=ep.example_inputs,
        constants=ep.constants,
        verifiers=[ep.verifier],
    )


def serialize(edge: EdgeProgramManager) -> ExecutorchProgramManager:
    import executorch.kernels.quantized  # noqa: F401  (out variants of quantized_decomposed ops)

    return edge.to_executorch()


def _channels_last(
    module: torch.nn.Module,
    example: tuple[torch.Tensor, ...],
    calibration: Sequence[tuple[torch.Tensor, ...]] | None,
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]] | None]:
    """4-D inputs (and the module's weights) in channels-last memory: ExecuTorch dim order (0, 2, 3, 1)."""

    def cl(t: torch.Tensor) -> torch.Tensor:
        return t.to(memory_format=torch.channels_last) if t.dim() == 4 else t

    calib = [tuple(cl(t) for t in batch) for batch in calibration] if calibration else None
    return module.to(memory_format=torch.channels_last), tuple(cl(t) for t in example), calib


def compile_model(
    module: torch.nn.Module | None,
    example_inputs: tuple[torch.Tensor, ...],
    target: str | TargetSpec,
    *,
    calibration: Sequence[tuple[torch.Tensor, ...]] | None = None,
    options: dict[str, Any] | None = None,
    quantize: bool = True,
    program: ExportedProgram | None = None,
    reg: Registry | None = None,
    progress: Progress | None = None,
    what: str = "the model",
) -> CompileResult:
    reg = reg or registry()
    tgt = reg.target(target) if isinstance(target, str) else target
    opts = {**tgt.option_defaults(), **(options or {})}
    progress = progress or _no_progress
    times: dict[str, float] = {}

    def stage(name: str) -> contextlib.AbstractContextManager[Any]:
        @contextlib.contextmanager
        def timed() -> Iterator[None]:
            start = time.perf_counter()
            with progress(name):
                yield
            times[name] = time.perf_counter() - start

        return timed()

    if opts.get("dim_order") == "channels_last" and program is None and module is not None:
        module, example_inputs, calibration = _channels_last(module, example_inputs, calibration)
    with stage("export"):
        if program is not None:
            float_ep = program
        else:
            assert module is not None
            float_ep = export_program(module, example_inputs, what)
    qep = None
    if quantize:
        calib = list(calibration) if calibration else [tuple(example_inputs)]
        with stage("quantize"):
            qep = quantize_program(float_ep, tgt, opts, calib, reg)
    with stage("lower"):
        edge, partitioner, parts, breakdown = lower_program(
            qep if qep is not None else float_ep, tgt, opts, reg
        )
    host_program = edge.exported_program()
    with stage("serialize"):
        et = serialize(
            EdgeProgramManager({"forward": clone_program(host_program)}, compile_config=edge.compile_config)
        )
        pte = et.buffer
    return CompileResult(
        target=tgt,
        options=opts,
        quantized=quantize,
        float_program=float_ep,
        quantized_program=qep,
        edge=edge,
        host_program=host_program,
        executorch=et,
        pte=pte,
        partitions=parts,
        decisions=partitioner.decisions,
        stage_seconds=times,
        lower_breakdown=breakdown,
    )
