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

from etforge.core import pipeline
from etforge.core.partitioner import Decision
from etforge.core.pipeline import Partition
from etforge.core.plugin_manager import Registry, registry
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
            float_ep = pipeline.export(module, example_inputs, what)
    qep = None
    if quantize:
        calib = list(calibration) if calibration else [tuple(example_inputs)]
        with stage("quantize"):
            qep = pipeline.quantize(float_ep, tgt, calib, reg, opts)
    with stage("lower"):
        edge, partitioner, parts, breakdown = pipeline.lower(
            qep if qep is not None else float_ep, tgt, opts, reg
        )
    host_program = edge.exported_program()
    with stage("serialize"):
        et = pipeline.serialize(
            EdgeProgramManager(
                {"forward": pipeline.clone_program(host_program)}, compile_config=edge.compile_config
            )
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
