"""A verify gate is one class plus its registration (issue 44): a plugin's ``etforge_verify_gates``.

The gate below is registered from outside etforge (``extra_plugins``, the way an installed
plugin loads) and judges what ``Compiled.verify`` — the same path as ``etforge verify`` —
gives it: its failures fail verify, its notes are told, and a gate that raises fails verify
with one line naming it and its plugin.
"""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

import etforge
from etforge.core.registry.manager import extra_plugins
from etforge.sdk import EtforgeError, GateInput, GateVerdict, VerifyGate, hookimpl


class OutputBound(VerifyGate):
    """Every output of model.pte within ``bound`` (a stand-in for a product's own rule)."""

    name = "output_bound"
    description = "model.pte's outputs within a bound"
    seen: list[GateInput] = []

    def __init__(self, bound: float) -> None:
        self.bound = bound

    def check(self, given: GateInput) -> GateVerdict:
        OutputBound.seen.append(given)
        failures = []
        for i, batch in enumerate(given.inputs):
            worst = max(float(t.abs().max()) for t in given.pte.run(list(batch)))
            if worst > self.bound:
                failures.append(f"sample {i}: |output| {worst:.3g} > {self.bound}")
        return GateVerdict(failures=failures[:1], notes=[f"{len(given.inputs)} samples bounded"])


class Broken(VerifyGate):
    name = "broken"

    def check(self, given: GateInput) -> GateVerdict:
        raise KeyError("no such field")


def _plugin(*gates: VerifyGate) -> types.ModuleType:
    module = types.ModuleType("gate_plugin")

    @hookimpl
    def etforge_verify_gates() -> list[VerifyGate]:
        return list(gates)

    module.etforge_verify_gates = etforge_verify_gates  # type: ignore[attr-defined]
    return module


@pytest.fixture(scope="module")
def compiled() -> Any:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)).eval()
    example = (torch.randn(1, 8),)
    calibration = [(torch.randn(1, 8),) for _ in range(8)]
    return etforge.compile(model, example, target="cortex-m33", calibration=calibration)


def test_a_registered_gate_judges_the_compile(compiled: Any) -> None:
    OutputBound.seen.clear()
    with extra_plugins(_plugin(OutputBound(bound=1e6))):
        passed = compiled.verify(samples=4)
    assert passed.ok, passed.failures
    assert len(OutputBound.seen) == 1 and len(OutputBound.seen[0].inputs) == 4
    assert OutputBound.seen[0].report["target"] == "cortex-m33"
    assert "output_bound: 4 samples bounded" in passed.notes and "gate:output_bound" in passed.seconds
    with extra_plugins(_plugin(OutputBound(bound=0.0))):
        failed = compiled.verify(samples=4)
    assert not failed.ok
    assert [f for f in failed.failures if f.startswith("output_bound: sample 0: |output|")]
    assert compiled.verify(samples=4).ok  # not installed: not run


def test_a_gate_that_raises_is_named_with_its_plugin(compiled: Any) -> None:
    with extra_plugins(_plugin(Broken())), pytest.raises(EtforgeError) as info:
        compiled.verify(samples=2)
    assert "verify gate 'broken' (plugin 'gate_plugin'" in str(info.value) and "KeyError" in str(info.value)
