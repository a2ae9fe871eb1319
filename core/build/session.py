"""One compile session: the one code path ``etforge compile`` and ``etforge.compile`` run.

A :class:`CompileSession` holds what one compile runs with (registry, target, options,
progress reporting) and runs its stages in order: export, graph rewrites, quantize + lower
(again, with ops decomposed, while a CPU op has no kernel), serialize, the memory budget.
Each second-best path it takes is a decision recorded in the session's fallback log
(``core.common.fallbacks``: the report's ``fallbacks``; ``strict`` refuses them):

* quantize and lower again after decomposing ops no kernel library provides
  (:meth:`CompileSession._build_with_kernels`, at most ``kernel_check.MAX_ROUNDS`` builds);
* the classic lowering after the early path could not be exact, and the classic lowering
  redone with every op decomposed (``core.lower.driver``: the path taken is ``result.lowering``);
* a CPU backend's own retry (Cortex-M's passes in another order), recorded by the plugin.

Scoped state, never globals: the fallback log is a context variable for the length of
:meth:`CompileSession.run`; the NPU backend finds its lowering through
``npu_backend.lowering`` (a context variable, since ExecuTorch calls ``preprocess``
statically); delegate shape stubs live inside one ``delegate_stubs.scope``. One thing rides
on the graph instead: the converter the partitioner chose for a node
(``node.meta[context.DECIDED_KEY]``), as ExecuTorch's own ``delegation_tag`` does, because
ExecuTorch copies node meta into the partition it hands ``preprocess`` and a script's
``to_edge_transform_and_lower`` (no session) must convert with the same choice.

What only the command line does (the build cache, ``codegen``, writing OUT) is layered on
top by ``etforge.cli``; :func:`compile_model` is the session for one call.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from executorch.exir import EdgeProgramManager, ExecutorchProgramManager
from torch.export import ExportedProgram

from etforge.core.build import equivalence, pipeline
from etforge.core.build.equivalence import Equivalence
from etforge.core.build.pipeline import Partition
from etforge.core.common import fallbacks
from etforge.core.common.errors import EtforgeError
from etforge.core.common.fallbacks import Fallback
from etforge.core.contracts.cpu_backend import LOWERING_NOTES_KEY
from etforge.core.contracts.target import TargetSpec
from etforge.core.front import signature
from etforge.core.front.export import Front, front_end
from etforge.core.graph.deferred_code import deferred_code
from etforge.core.graph.shared_provenance import shared_provenance
from etforge.core.lower import boundaries, float_ops, kernel_check
from etforge.core.lower.partitioner import Decision, EtforgePartitioner
from etforge.core.registry.manager import Registry, registry

Progress = Callable[[str], contextlib.AbstractContextManager[Any]]
#: Gets the float program alone (quantization still to run), then the float and quantized ones.
OnPrograms = Callable[[ExportedProgram, ExportedProgram | None], None]


@dataclass
class CompileResult:
    """Everything one compile produced: the programs of each stage, the ``.pte`` and what
    the report says about them (built by :meth:`CompileSession.result` only)."""

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
    #: Per input, [min, max] of an integer input over example and calibration (``core.front.signature``).
    input_ranges: list[list[int] | None] = field(default_factory=list)
    #: The lowering path taken ("early" | "classic") and why (``core.lower.driver.lower``).
    lowering: dict[str, Any] = field(default_factory=dict)
    #: Second-best paths taken, in order (``core.common.fallbacks``).
    fallbacks: list[Fallback] = field(default_factory=list)
    #: The edited float model against the exported one (``core.build.equivalence``); None: unedited.
    equivalence: Equivalence | None = None
    #: Calibration batches the observers saw, and whether they were the example input alone
    #: (no calibration data given: the int8 ranges fit one input; the report and summary say so).
    calibration_samples: int = 0
    calibrated_on_example: bool = False


@dataclass
class Built:
    """One quantize + lower round of a session."""

    quantized: ExportedProgram | None
    edge: EdgeProgramManager
    partitioner: EtforgePartitioner
    partitions: list[Partition]
    breakdown: dict[str, float]
    #: The lowering path taken and why (``core.lower.driver.lower``).
    lowering: dict[str, Any]


@contextlib.contextmanager
def _no_progress(stage: str) -> Iterator[None]:
    yield


class CompileSession:
    """One compile's settings, stage times and decisions; :meth:`run` compiles once.

    ``memory_budget`` (bytes, ``--memory-budget``): the planned arena, beside each NPU
    partition's working memory, must fit it. ``strict``: any fallback is an error
    (:class:`core.common.fallbacks.StrictFallback`). ``on_programs`` gets the float and
    quantized programs as soon as they are final (again on a rebuild), ``on_lowered`` the
    lowered Edge program once the last round built it, so they can be written while the rest
    compiles.
    """

    def __init__(
        self,
        target: str | TargetSpec,
        *,
        reg: Registry | None = None,
        options: dict[str, Any] | None = None,
        quantize: bool = True,
        early: bool = True,
        strict: bool = False,
        memory_budget: int | None = None,
        progress: Progress | None = None,
        on_programs: OnPrograms | None = None,
        on_lowered: Callable[[ExportedProgram], None] | None = None,
    ) -> None:
        self.registry = reg or registry()
        self.target = self.registry.target(target) if isinstance(target, str) else target
        self.options = {**self.target.option_defaults(), **(options or {})}
        self.quantize, self.early, self.strict = quantize, early, strict
        self.memory_budget = memory_budget
        self.progress = progress or _no_progress
        self.on_programs = on_programs
        self.on_lowered = on_lowered
        self.times: dict[str, float] = {}
        self._round = 1  # the quantize + lower round (another after a decomposition)
        self._rounds: list[dict[str, Any]] = []  # each round's lowering, when there are several
        self._observed: list[Any] = []  # the observed model's output on the first calibration batch

    @contextlib.contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Report ``name`` to the progress display and time it (``stage_seconds``)."""
        start = time.perf_counter()
        with self.progress(name):
            yield
        # A stage run again (a second build round) keeps every attempt's time: "lower (round 2)".
        key = name if self._round <= 1 else f"{name} (round {self._round})"
        self.times[key] = time.perf_counter() - start

    def run(
        self,
        module: torch.nn.Module | None,
        example_inputs: tuple[torch.Tensor, ...],
        *,
        calibration: Sequence[tuple[torch.Tensor, ...]] | None = None,
        program: ExportedProgram | None = None,
        what: str = "the model",
        front: Front | None = None,
    ) -> CompileResult:
        """Compile ``module`` (or the exported ``program``); ``front`` is an already exported
        front end (the CLI exports first, to look the build up in the cache)."""
        tgt, reg = self.target, self.registry
        with fallbacks.recording(self.strict) as log, deferred_code(), shared_provenance():
            if front is None:
                with self.stage("export"):
                    front = front_end(
                        module, example_inputs, calibration, tgt, self.options, reg, program, what
                    )
            notes = list(front.notes)
            with self.stage("rewrite"):
                float_ep, rewritten = pipeline.rewrite(front.program, tgt, reg)
            if rewritten:
                notes.append(f"graph rewrites applied: {', '.join(rewritten)}")
            calib = list(front.calibration) if front.calibration else [tuple(front.example)]
            float_ep, built = self._build_with_kernels(float_ep, calib)
            if self.quantize:  # an int8 program: every float op left on the CPU is told
                float_ops.record(
                    built.edge.exported_program(),
                    built.partitioner.decisions,
                    tgt.name,
                    reg.cpu_backend(tgt).name,
                )
            with self.stage("float check"):
                same = self._equivalence(front.program, float_ep, calib[0], rewritten)
            if same is not None and not same.passed and self.strict:  # else: the report says it
                raise EtforgeError(
                    f"strict: the compiled model does not compute the exported one: {same.why}; nothing written"
                )
            host_program = built.edge.exported_program()
            notes.extend(host_program.graph_module.meta.get(LOWERING_NOTES_KEY, ()))  # the CPU backend's
            with self.stage("serialize"):
                et = self._serialize(built)
            result = self.result(
                float_ep,
                built,
                et,
                notes=notes,
                input_ranges=signature.input_ranges(front.example, calib),
                fallbacks=list(log.items),
                equivalence=same,
                calibration_samples=len(calib) if self.quantize else 0,
                calibrated_on_example=self.quantize and not front.calibration,
            )
            self._check_memory(result)
        return result

    def _equivalence(
        self,
        exported: ExportedProgram,
        float_ep: ExportedProgram,
        batch: tuple[torch.Tensor, ...],
        rewritten: list[str],
    ) -> Equivalence | None:
        """The edited float model against the exported one on ``batch`` (``core/build/equivalence``);
        None when nothing edited it. A difference is traced to the rewrites or the quantizer."""
        observed = self.quantize and bool(self._observed)
        if observed:
            edited, what = self._observed[-1], "the observed model"
        elif float_ep is not exported:
            edited, what = equivalence.run(float_ep, batch), "the rewritten float program"
        else:
            return None
        reference = equivalence.run(exported, batch)
        same = equivalence.compare(reference, edited, what)
        if same.passed:
            return same
        float_differs = float_ep is not exported and (
            not observed or not equivalence.compare(reference, equivalence.run(float_ep, batch), "").passed
        )
        if float_differs:
            culprit = (
                f"graph rewrites {', '.join(rewritten)}"
                if rewritten
                else "a decomposition for a missing kernel"
            )
        else:
            culprit = "the quantizer's preparation: the BatchNorm fold or the CPU quantizer's passes"
        return dataclasses.replace(same, why=f"{same.why}; the edit: {culprit}")

    def _build_with_kernels(
        self, float_ep: ExportedProgram, calib: list[tuple[torch.Tensor, ...]]
    ) -> tuple[ExportedProgram, Built]:
        """Quantize and lower; while a CPU op has no kernel the device links, decompose it in
        the float program and build again (each decomposition a recorded fallback). Returns
        the float program actually built from and the last round.

        Raises :class:`EtforgeError` when an op has no kernel and no decomposition helps,
        before anything is serialized or written."""
        libraries = kernel_check.libraries_for(self.registry.cpu_backend(self.target))
        decomposed: list[str] = []
        for round_ in range(1, kernel_check.MAX_ROUNDS + 1):
            self._round = round_
            built = self._build(float_ep, calib)
            missing = kernel_check.missing_kernels(built.edge.exported_program(), libraries)
            self._rounds.append(
                {
                    "round": round_,
                    **{k: built.lowering.get(k) for k in ("path", "fallback", "reason")},
                    "seconds": {k: round(v, 4) for k, v in built.breakdown.items()},
                    "outcome": "built"
                    if not missing
                    else f"rebuilt: no kernel for {', '.join(sorted({m.op for m in missing}))}",
                }
            )
            if not missing:
                if len(self._rounds) > 1:  # the report's lowering names every round it took
                    built.lowering["rounds"] = list(self._rounds)
                if self.on_lowered is not None:  # final: the program model.pte is emitted from
                    self.on_lowered(built.edge.exported_program())
                return float_ep, built
            table = kernel_check.next_decomposition(
                missing, float_ep, decomposed, libraries, self.target.name
            )
            decomposed += [str(op) for op in table]
            float_ep = kernel_check.decompose(float_ep, table)
        raise kernel_check.error(missing, libraries, self.target.name, decomposed)

    def _build(self, float_ep: ExportedProgram, calib: list[tuple[torch.Tensor, ...]]) -> Built:
        """One round: quantize ``float_ep`` (unless ``--float``), then lower it."""
        q = None
        if self.on_programs is not None:
            self.on_programs(float_ep, None)  # final already: written while quantization runs
        if self.quantize:
            with self.stage("quantize"):
                self._observed = []
                q = pipeline.quantize(
                    float_ep, self.target, calib, self.registry, self.options, observed=self._observed
                )
        if self.on_programs is not None:
            self.on_programs(float_ep, q)
        return self.lower(q if q is not None else float_ep, q)

    def lower(self, program: ExportedProgram, quantized: ExportedProgram | None) -> Built:
        """Lower ``program`` (``quantized``, or the float program under ``--float``)."""
        lowering: dict[str, Any] = {}
        with self.stage("lower"):
            edge, partitioner, parts, breakdown = pipeline.lower(
                program, self.target, self.options, self.registry, early=self.early, lowering=lowering
            )
        return Built(quantized, edge, partitioner, parts, breakdown, lowering)

    def _serialize(self, built: Built) -> ExecutorchProgramManager:
        """The ``.pte``, checked: delegate dim orders as converted, every operator a kernel."""
        host_program = built.edge.exported_program()
        et = pipeline.serialize(
            EdgeProgramManager(
                {"forward": pipeline.clone_program(host_program)}, compile_config=built.edge.compile_config
            ),
            host_program,
        )
        # The emitted program the bytes were serialized from (to_executorch serializes it): its
        # operator table and values are what the .pte holds, without parsing the bytes back.
        program = et.executorch_program
        boundaries.check_delegate_dim_orders(program, _delegate_layouts(host_program, built.partitions))
        libraries = kernel_check.libraries_for(self.registry.cpu_backend(self.target))
        kernel_check.check_pte(program, libraries, self.target.name)
        return et

    def _check_memory(self, result: CompileResult) -> None:
        """The planned memory within ``memory_budget`` (nothing to check without one)."""
        if self.memory_budget is None:
            return
        from etforge.core.serialize.memory import check_budget, memory_stats
        from etforge.core.serialize.npu_memory import plan_result

        check_budget(memory_stats(result.executorch), self.memory_budget, plan_result(result))

    def result(
        self, float_ep: ExportedProgram, built: Built, et: ExecutorchProgramManager, **extra: Any
    ) -> CompileResult:
        """The :class:`CompileResult` of ``built`` serialized as ``et`` (``extra``: notes,
        input ranges, fallbacks) — the one place a result is assembled."""
        return CompileResult(
            target=self.target,
            options=self.options,
            quantized=self.quantize,
            float_program=float_ep,
            quantized_program=built.quantized,
            edge=built.edge,
            host_program=built.edge.exported_program(),
            executorch=et,
            pte=et.buffer,
            partitions=built.partitions,
            decisions=built.partitioner.decisions,
            stage_seconds=self.times,
            lower_breakdown=built.breakdown,
            lowering=built.lowering,
            **extra,
        )


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
    on_programs: OnPrograms | None = None,
    early: bool = True,
    strict: bool = False,
    memory_budget: int | None = None,
) -> CompileResult:
    """One :class:`CompileSession` run: compile ``module`` (or the exported ``program``)."""
    session = CompileSession(
        target,
        reg=reg,
        options=options,
        quantize=quantize,
        early=early,
        strict=strict,
        memory_budget=memory_budget,
        progress=progress,
        on_programs=on_programs,
    )
    return session.run(
        module, example_inputs, calibration=calibration, program=program, what=what, front=front
    )
