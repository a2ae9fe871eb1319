"""The whole compile, stage by stage (``pipeline``), timed and with progress reports."""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from executorch.exir import EdgeProgramManager, ExecutorchProgramManager
from torch.export import ExportedProgram

from etforge.core import boundaries, pipeline
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
    #: Things the user should know that are not errors.
    notes: list[str] = field(default_factory=list)


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


class NchwAtEdges(torch.nn.Module):
    """``inner`` run channels-last, fed and read in NCHW: one conversion per 4-D input/output.

    For NHWC CPU kernels and NPU partitions the whole inside stays channels-last (no
    conversions between them); only the user's NCHW tensors are converted, at the edges.
    ``forward`` carries ``inner``'s signature so the program's inputs keep their names.
    """

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner.to(memory_format=torch.channels_last)

        def forward(*args: Any) -> Any:
            inside = [a.contiguous(memory_format=torch.channels_last) if _is_4d(a) else a for a in args]
            out = self.inner(*inside)
            return torch.utils._pytree.tree_map(lambda t: t.contiguous() if _is_4d(t) else t, out)

        forward.__signature__ = inspect.signature(inner.forward)  # type: ignore[attr-defined]
        self.forward = forward


def _is_4d(t: object) -> bool:
    return isinstance(t, torch.Tensor) and t.dim() == 4


def adapt_layout(
    module: torch.nn.Module,
    example: tuple[torch.Tensor, ...],
    calibration: Sequence[tuple[torch.Tensor, ...]] | None,
    target: TargetSpec,
    options: dict[str, Any],
    reg: Registry | None = None,
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]] | None]:
    """Channels-last inside when the target's CPU kernels are NHWC (before export).

    ``dim_order=channels_last``: the caller's 4-D tensors are NHWC too, nothing converts;
    ``contiguous``: NCHW at the edges, one conversion per 4-D input and output.
    """
    calib = list(calibration) if calibration is not None else None
    if not (reg or registry()).cpu_backend(target).channels_last:
        return module, example, calib
    if options.get("dim_order", "channels_last") == "channels_last":
        return _channels_last(module, example, calib)
    return NchwAtEdges(module), example, calib


def _nchw_program_note(program: ExportedProgram, target: TargetSpec) -> list[str]:
    """An exported program's layout is fixed: say so when NCHW inputs meet NHWC kernels."""
    nchw = [
        n.name
        for n in program.graph.nodes
        if n.op == "placeholder"
        and n.name in program.graph_signature.user_inputs
        and isinstance(v := n.meta.get("val"), torch.Tensor)
        and v.dim() == 4
        and v.is_contiguous()
    ]
    if not nchw:
        return []
    return [
        f"the exported program takes NCHW 4-D inputs ({', '.join(nchw)}): its tensors stay NCHW, "
        f"so NHWC kernels on {target.name} convert layouts; export with channels_last inputs "
        "(or compile the module itself) to keep everything NHWC"
    ]


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

    notes: list[str] = []
    if program is None and module is not None:
        module, example_inputs, calibration = adapt_layout(
            module, example_inputs, calibration, tgt, opts, reg
        )
    elif program is not None and reg.cpu_backend(tgt).channels_last:
        notes += _nchw_program_note(program, tgt)
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
        boundaries.check_delegate_dim_orders(pte, _delegate_layouts(host_program, parts))
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
        notes=notes,
    )
