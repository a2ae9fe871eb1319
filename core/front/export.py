"""The compile's front end — dtype, layout, ``torch.export`` — without importing ExecuTorch.

Everything the build cache's key needs comes from here, so a recompile that the cache
answers never pays for importing ExecuTorch, torchao or LiteRT.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.export import ExportedProgram

from etforge.core.common.errors import EtforgeError
from etforge.core.contracts.target import TargetSpec
from etforge.core.front.asserts import drop_metadata_asserts
from etforge.core.front.context_regions import inline_context_regions
from etforge.core.front.functionalize import functionalize
from etforge.core.front.load import as_float32, has_float64, refuse_float64, refuse_no_tensor_output
from etforge.core.front.signature import check_example
from etforge.core.front.state import refuse_running_state
from etforge.core.registry.manager import Registry, registry


@dataclass
class Front:
    """The exported float program and the tensors it was exported and is calibrated with."""

    program: ExportedProgram
    example: tuple[torch.Tensor, ...]
    calibration: list[tuple[torch.Tensor, ...]] | None
    notes: list[str] = field(default_factory=list)


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


def nchw_program_note(program: ExportedProgram, target: TargetSpec) -> list[str]:
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


def export(
    module: torch.nn.Module, example: tuple[torch.Tensor, ...], what: str = "the model"
) -> ExportedProgram:
    """``torch.export`` in eval mode (the device runs inference); each submodule's own mode is
    given back afterwards, so compiling never changes the caller's model."""
    modes = [(m, m.training) for m in module.modules()]
    try:
        return torch.export.export(module.eval(), example, strict=False)
    except Exception as exc:
        lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()][:6]
        raise EtforgeError(
            f"torch.export rejected {what}: {type(exc).__name__}: " + "\n  ".join(lines)
        ) from None
    finally:
        for m, training in modes:
            m.training = training


def training_mode_note(module: torch.nn.Module, what: str = "the model") -> list[str]:
    """The note that a module given in training mode was compiled in eval mode (say which
    submodules, when only some were training: a forgotten ``.eval()`` on a part)."""
    training: list[str] = []
    for name, m in module.named_modules():  # parents first: name only the outermost training part
        if m.training and not any(name.startswith(f"{t}.") for t in training):
            training.append(name)
    if not training:
        return []
    part = "" if module.training else f" ({', '.join(training[:3])}{' …' if len(training) > 3 else ''})"
    return [
        f"{what} was in training mode{part}: compiled in eval mode, as the device runs it (batch norm "
        "with its running statistics, dropout off); call model.eval() before compiling to make that explicit"
    ]


def front_end(
    module: torch.nn.Module | None,
    example: tuple[torch.Tensor, ...],
    calibration: Sequence[tuple[torch.Tensor, ...]] | None,
    target: TargetSpec,
    options: dict[str, Any],
    reg: Registry,
    program: ExportedProgram | None = None,
    what: str = "the model",
    owned: bool = False,
) -> Front:
    """float32, the target's layout, then ``torch.export`` and functional ops (``core/functionalize``);
    a given program is only made functional.

    Both conversions change a module in place (``nn.Module.to``), so a caller's module is
    copied first: compiling must not leave it channels-last or float32, or the next compile
    of the same module would see another program. ``owned``: the caller built the module for
    this compile alone (the command does), no copy is needed."""
    notes: list[str] = []
    check_example(example, what)  # a zero-size input: refused here, naming it
    calib = list(calibration) if calibration is not None else None
    if program is not None:
        refuse_float64(program, what)
        if reg.cpu_backend(target).channels_last:
            notes += nchw_program_note(program, target)
        given = program
        program, regions = inline_context_regions(program, owned=False)
        program, mutations = functionalize(program, owned=not regions)
        program, asserts = drop_metadata_asserts(program, owned=program is not given)
        refuse_running_state(program, what)
        refuse_no_tensor_output(program, what)
        return Front(program, tuple(example), calib, notes + regions + mutations + asserts)
    assert module is not None
    if not owned and (
        reg.cpu_backend(target).channels_last or has_float64([*module.parameters(), *module.buffers()])
    ):
        try:
            module = copy.deepcopy(module)
        except Exception as exc:  # a lock, a file, a native handle: convert in place, and say so
            notes.append(
                f"{what} could not be copied ({type(exc).__name__}: {exc}); its parameters were "
                "converted in place (channels-last / float32)"
            )
    notes += training_mode_note(module, what)
    module, example, calib, cast = as_float32(module, example, calib)
    notes += [cast] if cast else []
    module, example, calib = adapt_layout(module, example, calib, target, options, reg)
    # In-place ops (nn.ReLU(inplace=True), +=) leave the front end as their functional forms:
    # every later stage, on every target and lowering path, sees functional ops only.
    program, regions = inline_context_regions(export(module, example, what))
    program, mutations = functionalize(program)
    program, asserts = drop_metadata_asserts(program)
    refuse_running_state(program, what)
    refuse_no_tensor_output(program, what)
    return Front(program, tuple(example), calib, notes + regions + mutations + asserts)
