"""A program that the direct construction cannot build is re-exported with ``torch.export``
(slower, same program), and the compile says so: a recorded fallback in the quantize and
rewrite stages, refused under strict like every fallback."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from etforge.core.build import pipeline
from etforge.core.common import fallbacks
from etforge.core.common.fallbacks import StrictFallback
from etforge.core.graph import program as program_from_graph
from etforge.core.graph.program import Unsupported
from etforge.core.registry.manager import registry


class Counting(nn.Module):
    """Counts its calls in a buffer: the program mutates its state (the direct construction
    refuses it)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return self.fc(x)


def _program() -> tuple[torch.export.ExportedProgram, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    example = (torch.randn(1, 4, generator=torch.Generator().manual_seed(2)),)
    return torch.export.export(Counting().eval(), example, strict=False), example


def test_quantize_tells_its_reexport() -> None:
    ep, example = _program()
    reg = registry()
    with fallbacks.recording() as log:
        pipeline.quantize(ep, reg.target("imxrt700"), [example], reg)
    (item,) = [f for f in log.items if f.stage == "quantize"]
    assert (
        "re-exported the quantized program" in item.what
        and "add_ calls" in item.why
        and "not a functional operator" in item.why
    )
    ep, example = _program()
    with fallbacks.recording(strict=True), pytest.raises(StrictFallback, match="re-exported the quantized"):
        pipeline.quantize(ep, reg.target("imxrt700"), [example], reg)


class Shuffle(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        return x.view(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)


def test_rewrite_tells_its_reexport(monkeypatch: pytest.MonkeyPatch) -> None:
    reg = registry()
    target = reg.target("imxrt700")
    ep = torch.export.export(Shuffle().eval(), (torch.randn(1, 4, 3, 3),), strict=False)

    def refuse(*args: object) -> None:
        raise Unsupported("a graph the direct construction does not take")

    monkeypatch.setattr(program_from_graph, "program_from_graph", refuse)
    with fallbacks.recording() as log:
        _, applied = pipeline.rewrite(ep, target, reg)
    assert applied
    (item,) = [f for f in log.items if f.stage == "rewrite"]
    assert "re-exported the rewritten program" in item.what and item.where == ", ".join(applied)
    assert item.why == "a graph the direct construction does not take"
