"""The ExecuTorch idiom (README "swap in two lines") and etforge.compile give one program.

A plain ``to_edge_transform_and_lower`` script with ``etforge.target(name)``'s quantizer,
partitioners and CPU lowering must produce, byte for byte, the ``.pte`` that
``etforge.compile(..., lowering="classic")`` produces, on every registered target: the
model below needs the CPU backend's kept-whole ops (a Linear left to CMSIS-NN on
cortex-m33), two float-graph rewrites (hardswish, division by a constant) and etforge's
memory planning, each of which a script used to miss.
"""

from __future__ import annotations

import pytest
import torch
from executorch.codegen.tools.selective_build import _get_program_from_buffer, _get_program_operators
from executorch.exir import to_edge_transform_and_lower
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

import etforge
from etforge.core.plugin_manager import registry


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.hardswish(self.conv(x)) / 2.0
        return self.fc(torch.nn.functional.max_pool2d(y, 2).flatten(1))


def _model() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(1, 3, 4, 4, generator=g),) for _ in range(4)]
    return Net().eval(), calib[0], calib


def _script(name: str) -> bytes:
    model, example, calib = _model()
    target = etforge.target(name)
    model, example, calib = target.adapt(model, example, calib)
    prepared = prepare_pt2e(
        torch.export.export(model, example).module(check_guards=False), target.quantizer()
    )
    for batch in calib:
        prepared(*batch)
    quantized = torch.export.export(convert_pt2e(prepared), example)
    edge = to_edge_transform_and_lower(
        quantized, partitioner=target.partitioners(), compile_config=target.compile_config()
    )
    return target.lower_cpu(edge).to_executorch().buffer


def _ops(pte: bytes) -> list[str]:
    return _get_program_operators(_get_program_from_buffer(pte))


@pytest.mark.parametrize("name", sorted(registry().targets))
def test_script_and_etforge_compile_give_the_same_pte(name: str) -> None:
    model, example, calib = _model()
    compiled = etforge.compile(model, example, target=name, calibration=calib, lowering="classic")
    assert "graph rewrites applied: Hardsigmoid, DivByConstant" in compiled.report["notes"]
    script = _script(name)
    assert script == compiled.pte
    if name == "cortex-m33":  # the Linear on CMSIS-NN, not left float (aten::addmm)
        assert "cortex_m::quantized_linear.out" in _ops(script)
        assert "aten::addmm.out" not in _ops(script)


def test_linear_kept_off_the_npu_runs_on_cmsis_nn() -> None:
    """imxrt700cm with the Linear kept off the NPU: quantized the CPU's way, run by CMSIS-NN."""
    model, example, calib = _model()
    compiled = etforge.compile(
        model,
        example,
        target="imxrt700cm",
        calibration=calib,
        options={"operators_not_to_delegate": "aten.linear.default"},
    )
    assert "cortex_m::quantized_linear.out" in _ops(compiled.pte)
    (linear,) = [n for n in compiled.report["nodes"] if n["op"] == "aten.linear.default"]
    assert linear["placement"] == "cortex-m"
    assert linear["cpu_op"] == "cortex_m.quantized_linear.default"
    assert linear["reason"] == "listed in operators_not_to_delegate"
    check = compiled.verify(samples=8)
    assert check.ok, check.failures
