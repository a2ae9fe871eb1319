"""Shape-only stand-ins for delegates' original programs while ExecuTorch re-traces a program.

Every ExecuTorch pass that re-traces a program (the Edge passes, and each pass of
``to_executorch``) runs a delegate call's fake-tensor rule, which unlifts and traces the
delegate's whole original program: on a model that is all NPU, that is most of the cost of
those passes, to learn output shapes the call node already carries. The stub answers with
those shapes. It keeps the original's graph, which the emitter reads for debug handles, and
the original goes back when the passes are done (verify runs it on the host): stubs are
installed inside a :func:`scope` block, which restores every program it saw when it ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.export import ExportedProgram


class _ShapeStub(torch.nn.Module):
    """A delegate's outputs as empty tensors of their shapes, strides and dtypes."""

    def __init__(self, outs: list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]]) -> None:
        super().__init__()
        self.outs = outs

    def forward(self, *xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(torch.empty_strided(s, st, dtype=d) for s, st, d in self.outs)


class StubProgram:
    """The original program, except that ``module()`` is the shape stub."""

    def __init__(self, original: ExportedProgram, module: torch.nn.Module) -> None:
        self.__dict__.update(original=original, _module=module)

    def module(self, **_: Any) -> torch.nn.Module:
        return self._module

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.__dict__["original"], name)


def stub(ep: ExportedProgram) -> None:
    """Give each delegate call of ``ep`` a shape stub (a stubbed one keeps its stub)."""
    from executorch.exir.delegate import executorch_call_delegate

    for n in ep.graph_module.graph.nodes:
        if n.op != "call_function" or n.target is not executorch_call_delegate:
            continue
        lm = getattr(ep.graph_module, str(n.args[0].target))
        if isinstance(lm._original_exported_program, StubProgram):
            continue
        outs = [(tuple(v.shape), tuple(v.stride()), v.dtype) for v in n.meta["val"]]
        lm._original_exported_program = StubProgram(lm._original_exported_program, _ShapeStub(outs))


def restore(*programs: ExportedProgram) -> None:
    """Put the originals back in every lowered module the programs hold (copies included)."""
    for ep in programs:
        for m in ep.graph_module.modules():
            held = getattr(m, "_original_exported_program", None)
            if isinstance(held, StubProgram):
                m._original_exported_program = held.original


class StubScope:
    """The programs whose delegates are stubbed inside one :func:`scope` block."""

    def __init__(self) -> None:
        self.programs: list[ExportedProgram] = []

    def stub(self, ep: ExportedProgram) -> None:
        """Stub ``ep``'s delegates until the block ends."""
        self.track(ep)
        stub(ep)

    def track(self, *programs: ExportedProgram) -> None:
        """Restore ``programs`` too when the block ends (copies holding stubbed modules)."""
        self.programs.extend(p for p in programs if all(p is not q for q in self.programs))


@contextlib.contextmanager
def scope(*also: ExportedProgram) -> Iterator[StubScope]:
    """Stubs live exactly as long as this block: every program stubbed or tracked in it, and
    ``also``, has its originals back when it ends, error or not."""
    stubs = StubScope()
    stubs.track(*also)
    try:
        yield stubs
    finally:
        restore(*stubs.programs)


@contextlib.contextmanager
def shape_only(ep: ExportedProgram, *also: ExportedProgram) -> Iterator[None]:
    """Stub ``ep``'s delegates for the block; restore them in ``ep`` and ``also`` after it."""
    with scope(*also) as stubs:
        stubs.stub(ep)
        yield
