"""Ops whose values come from no input value compile right on the Cortex-M CPU backend.

``zeros_like(x)``, ``ones_like(x)``, ``full_like(x, v)``: PT2E gives their output the input's
qparams, and the Cortex-M lowering folds the Q/DQ around them, so the int8 program used to
compute ``full_like(x_int8, v)`` — int8 ``0`` for ``zeros_like``, which is
``(0 - zero_point) * scale``, not ``0.0``. The ``ValueOpsAsConstants`` rewrite makes them
constants before quantization; verify's gates (each CPU op against its reference, the whole
program, top-1) must pass, and the ``.pte`` must run like the host program.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import etforge
from etforge.runtime.execution.pte_interpreter import PteInterpreter
from etforge.runtime.verification.inputs import seeded_inputs
from etforge.runtime.verification.pte_agreement import compare_with_edge
from etforge.runtime.verification.verify import compare

TARGETS = ("imxrt700cm", "cortex-m33")
KINDS = ("zeros_like", "ones_like", "full_like")
SAMPLES = 8


class Masked(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.kind = kind

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.kind == "zeros_like":
            fill = torch.zeros_like(x)
        elif self.kind == "ones_like":
            fill = torch.ones_like(x)
        else:
            fill = torch.full_like(x, 0.75)
        return self.fc(torch.where(mask, x, fill))


def _calibration() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randn(1, 8, generator=g), torch.randint(0, 2, (1, 8), generator=g).bool())
        for _ in range(SAMPLES)
    ]


def _compile(kind: str, target: str) -> etforge.Compiled:
    torch.manual_seed(0)
    calib = _calibration()
    return etforge.compile(Masked(kind).eval(), calib[0], target, calibration=calib)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kind", KINDS)
def test_value_creating_op_compiles_and_verifies(kind: str, target: str) -> None:
    c = _compile(kind, target)
    r = c.result
    edge_outputs: list[list[object]] = []
    v = compare(r.host_program, r.float_program, r.quantized_program, c.report,
                samples=SAMPLES, edge_outputs=edge_outputs)  # fmt: skip
    assert v.ok, v.failures
    # no shape-only op is left to run on int8 inputs
    ops = {n.target.__name__ for n in r.host_program.graph.nodes if n.op == "call_function"}
    assert not any(op.startswith(("aten.full_like", "aten.zeros_like", "aten.ones_like")) for op in ops), ops
    batches = seeded_inputs(c.report, 0, SAMPLES)
    agreement = compare_with_edge(PteInterpreter(c.pte), r.host_program, batches, "default", edge_outputs)
    assert agreement.ok, agreement.first_difference


def test_the_constant_is_deterministic_and_a_cpu_only_portable_target_keeps_the_op() -> None:
    from etforge.plugins.rewrites.constants import ValueOpsAsConstants
    from etforge.sdk import TargetSpec

    assert _compile("full_like", "cortex-m33").pte == _compile("full_like", "cortex-m33").pte
    # with an NPU the value is folded too (the partition holds it, as upstream's NXP flow does)
    c = _compile("full_like", "imxrt700")
    ops = {n.target.__name__ for n in c.result.quantized_program.graph.nodes if n.op == "call_function"}
    assert not any("full_like" in op for op in ops), ops
    # the portable CPU kernels keep explicit Q/DQ around the op: without an NPU, nothing to rewrite
    cpu_only = TargetSpec("cpu-portable", "portable kernels only", npu=None, cpu_fallback="portable")
    assert not ValueOpsAsConstants().applies_to(cpu_only)
