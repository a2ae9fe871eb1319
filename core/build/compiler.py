"""The whole compile, stage by stage (``pipeline``), timed and with progress reports."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from executorch.exir import EdgeProgramManager, ExecutorchProgramManager
from torch.export import ExportedProgram

from etforge.core.lower import boundaries
from etforge.core.common import fallbacks
from etforge.core.lower import kernel_check
from etforge.core.build import pipeline
from etforge.core.front import signature
from etforge.core.contracts.cpu_backend import LOWERING_NOTES_KEY
from etforge.core.common.fallbacks import Fallback
from etforge.core.front.export import Front, NchwAtEdges, adapt_layout, front_end
from etforge.core.lower.partitioner import Decision
from etforge.core.build.pipeline import Partition
from etforge.core.registry.manager import Registry, registry
from etforge.core.contracts.target import TargetSpec

__all__ = ["CompileResult", "NchwAtEdges", "adapt_layout", "compile_model"]

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
    #: Things the user should know that are not errors.
    notes: list[str] = field(default_factory=list)
    #: Per input, [min, max] of an integer input over example and calibration (``core.signature``).
    input_ranges: list[list[int] | None] = field(default_factory=list)
    #: The lowering path taken ("early" | "classic") and why (``pipeline.lower``).
    lowering: dict[str, Any] = field(default_factory=dict)
    #: Second-best paths taken, in order (``core.fallbacks``).
    fallbacks: list[Fallback] = field(default_factory=list)


@contextlib.contextmanager
def _no_progress(stage: str) -> Iterator[None]:
    yield


def _delegate_layouts(
    ep: ExportedProgram, parts: list[Partition]
) -> list[tuple[str, list[list[int]], list[list[int]]]]:
    """(name, input dim orders, output dim orders) of each delegate call, in program order."""
    by_bytes = {p.processed: p for p in parts}
    layouts = []
    for node in ep.graph_module.graph.nodes:
        if node.op == "call_function" and node.target is torch.ops.higher_order.executorch_call_delegate:
            lowered = getattr(ep.graph_module, str(node.args[0].target))
            p = by_bytes[bytes(lowered.processed_bytes)]
            c = p.converted
            layouts.append(
                (p.name, [list(d) for d in c.input_dim_orders], [list(d) for d in c.output_dim_orders])
            )
    return layouts


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
    front: Front | None = None,
    on_programs: Callable[[ExportedProgram, ExportedProgram | None], None] | None = None,
    early: bool = True,
    strict: bool = False,
) -> CompileResult:
    """Compile ``module`` (or the exported ``program``); ``front`` is an already exported
    front end (the CLI exports first, to look the build up in the cache). ``on_programs``
    gets the float and quantized programs as soon as they are final (again on a rebuild),
    so they can be written while the rest compiles: the float program alone before
    quantization, then both (a program passed again is the same object). ``strict``: any
    fallback is an error (:class:`core.fallbacks.StrictFallback`)."""
    with fallbacks.recording(strict) as log:
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

        if front is None:
            with stage("export"):
                front = front_end(module, example_inputs, calibration, tgt, opts, reg, program, what)
        float_ep, example_inputs, calibration = front.program, front.example, front.calibration
        notes = list(front.notes)
        with stage("rewrite"):
            float_ep, rewritten = pipeline.rewrite(float_ep, tgt, reg)
        if rewritten:
            notes.append(f"graph rewrites applied: {', '.join(rewritten)}")
        calib = list(calibration) if calibration else [tuple(example_inputs)]
        lowering: dict[str, Any] = {}

        def build(ep: ExportedProgram) -> tuple[Any, ...]:
            q = None
            if on_programs is not None:
                on_programs(ep, None)  # final already: written while quantization runs
            if quantize:
                with stage("quantize"):
                    q = pipeline.quantize(ep, tgt, calib, reg, opts)
            if on_programs is not None:
                on_programs(ep, q)
            with stage("lower"):
                return (
                    q,
                    *pipeline.lower(
                        q if q is not None else ep, tgt, opts, reg, early=early, lowering=lowering
                    ),
                )

        # Every CPU op needs a kernel the device links: ops without one are decomposed (and the
        # program rebuilt) or refused here, before anything is serialized or written.
        libraries = kernel_check.libraries_for(reg.cpu_backend(tgt))
        float_ep, (qep, edge, partitioner, parts, breakdown) = kernel_check.lower_with_kernels(
            float_ep, build, lambda built: built[1].exported_program(), libraries, tgt.name
        )
        host_program = edge.exported_program()
        notes.extend(host_program.graph_module.meta.get(LOWERING_NOTES_KEY, ()))  # the CPU backend's
        with stage("serialize"):
            et = pipeline.serialize(
                EdgeProgramManager(
                    {"forward": pipeline.clone_program(host_program)}, compile_config=edge.compile_config
                ),
                host_program,
            )
            pte = et.buffer
            boundaries.check_delegate_dim_orders(pte, _delegate_layouts(host_program, parts))
            kernel_check.check_pte(pte, libraries, tgt.name)
        result = CompileResult(
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
            notes=notes,
            input_ranges=signature.input_ranges(example_inputs, calib),
            lowering=lowering,
            fallbacks=list(log.items),
        )
    return result
