"""The ExecuTorch idiom (README "swap in two lines") and etforge.compile give one program.

A plain ``to_edge_transform_and_lower`` script with ``etforge.target(name)``'s quantizer,
partitioners and CPU lowering must produce, byte for byte, the ``.pte`` that
``etforge.compile(..., lowering="classic")`` produces, on every registered target: the
model below needs the CPU backend's kept-whole ops (a Linear left to CMSIS-NN on
cortex-m33), two float-graph rewrites (hardswish, division by a constant) and etforge's
memory planning, each of which a script used to miss.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from executorch.codegen.tools.selective_build import _get_program_from_buffer, _get_program_operators
from executorch.exir import to_edge_transform_and_lower
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

import etforge
from etforge.core.registry.manager import registry


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


def _script(name: str, batches: int = 4, save: Path | None = None) -> bytes:
    """The README's script; ``batches``: how much of the calibration data it uses."""
    model, example, calib = _model()
    target = etforge.target(name)
    model, example, calib = target.adapt(model, example, calib)
    prepared = prepare_pt2e(
        torch.export.export(model, example).module(check_guards=False), target.quantizer()
    )
    for batch in calib[:batches]:
        prepared(*batch)
    quantized = torch.export.export(convert_pt2e(prepared), example)
    if save is not None:
        torch.export.save(quantized, str(save))
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


FACTORY = """
import torch
from test_idiom import _model


def build():
    return _model()
"""


def test_verify_takes_a_scripts_pte(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``etforge verify PTE --model MODEL``: the script's program against the model it came from."""
    from etforge.runtime.verification.script_pte import verify_script_pte

    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    (tmp_path / "net.py").write_text(FACTORY)
    model = f"{tmp_path / 'net.py'}:build"
    same = tmp_path / "same.pte"
    same.write_bytes(_script("imxrt700cm"))
    v = verify_script_pte(same, model, "imxrt700cm", samples=4)
    assert v.ok, v.failures
    assert v.pte is not None and v.pte.agreed == v.pte.samples == 4
    assert "byte for byte the program etforge compiles from it" in v.notes[0]
    # A script that calibrated on one batch quantized differently: against etforge's own
    # quantization it computes other values (named), against its own quantized program it passes.
    other = tmp_path / "other.pte"
    other.write_bytes(_script("imxrt700cm", batches=1, save=tmp_path / "other.pt2"))
    v = verify_script_pte(other, model, "imxrt700cm", samples=4)
    assert not v.ok and v.failures[0].startswith(f"{other} differs from the Edge program")
    v = verify_script_pte(other, model, "imxrt700cm", quantized=str(tmp_path / "other.pt2"), samples=4)
    assert v.ok, v.failures
    assert "byte for byte" in v.notes[0] and v.pte.agreed == 4
