"""``clone_program``: a copy the lowering may edit without touching the caller's program."""

from __future__ import annotations

import torch
from torch import nn

from etforge.core.graph.utils import clone_program
from etforge.core.lower.driver import drop_dead_constants


class Unread(nn.Module):
    """A buffer and a non-persistent constant the graph never reads (as a replaced weight's
    scales are, once the Cortex-M passes fold them)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.register_buffer("scales", torch.rand(4))
        self.register_buffer("table", torch.ones(3), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def test_dropping_a_clones_constants_leaves_the_callers_program_whole() -> None:
    """The lowering drops constants nothing reads (``drop_dead_constants``, ExecuTorch's
    unused-parameter pass). A clone shared its state dict with the caller's program, so
    verify's quantized program lost them, and ``.module()`` died with ``KeyError: '_scale_0'``
    (timm's edgenext on cortex-m33)."""
    x = torch.randn(1, 3, 4, 4)
    program = torch.export.export(Unread().eval(), (x,), strict=False)
    keys = (set(program.state_dict), set(program.constants))
    assert "scales" in keys[0] and "table" in keys[1]
    work = clone_program(program)
    assert drop_dead_constants(work) == 2
    assert "scales" not in work.state_dict and "table" not in work.constants
    assert (set(program.state_dict), set(program.constants)) == keys
    torch.testing.assert_close(program.module()(x), work.module()(x))
