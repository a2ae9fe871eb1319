"""Every op left on the CPU has a kernel on the device (core/lower/kernel_check.py).

An op no linked kernel library provides is decomposed (torch's decomposition, before
quantization) or refused naming the node, the op and the libraries tried — before anything
is written. Which library provides which op is read independently here, from the yaml files
ExecuTorch ships, and the program's operators from the ``.pte`` by ExecuTorch's own reader.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn

import etforge
from etforge.core.common.errors import EtforgeError

from support import run_cli

#: The yaml files of the kernel libraries each CPU backend links (lookup order).
CMSIS = "backends/cortex_m/ops/operators.yaml"
PORTABLE = ("kernels/quantized/quantized.yaml", "kernels/portable/functions.yaml",
            "kernels/portable/custom_ops.yaml", "kernels/portable/et_copy_ops.yaml")  # fmt: skip


def _library_ops(files: tuple[str, ...]) -> set[str]:
    spec = importlib.util.find_spec("executorch")
    assert spec is not None and spec.submodule_search_locations
    root = Path(list(spec.submodule_search_locations)[0])
    ops = set()
    for rel in files:
        for entry in yaml.safe_load((root / rel).read_text()) or []:
            name = (entry.get("func") or "").split("(")[0] or entry["op"]
            ops.add(name if "::" in name else f"aten::{name}")
    return ops


def _program_ops(pte: bytes) -> set[str]:
    from executorch.codegen.tools.selective_build import (  # type: ignore[import-not-found]
        _get_program_from_buffer,
        _get_program_operators,
    )

    return set(_get_program_operators(_get_program_from_buffer(pte)))


def _without_kernel(pte: bytes, target: str) -> set[str]:
    files = (CMSIS, *PORTABLE) if target != "imxrt700" else PORTABLE
    return _program_ops(pte) - _library_ops(files)


def _data(*shape: int, n: int = 4) -> tuple[tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    g = torch.Generator().manual_seed(3)
    return (torch.randn(shape, generator=g),), [(torch.randn(shape, generator=g),) for _ in range(n)]


class HardSigmoidGate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.gate = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.conv(x))
        return (y * F.hardsigmoid(self.gate(F.adaptive_avg_pool2d(y, 1)))).mean((2, 3))


class Lstm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm, self.fc = nn.LSTM(6, 8, batch_first=True), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.lstm(x)[0][:, -1])


class Fft(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(9, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.fft.rfft(x).abs())


class CeilPool(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(F.relu(self.conv(x)), 3, 2, ceil_mode=True).flatten(1)


@torch.library.custom_op("etforge_test::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


class CustomOp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(twice(x))


@pytest.mark.parametrize("target", ["imxrt700cm", "cortex-m33"])
def test_hardsigmoid_is_decomposed_into_ops_with_kernels(target: str) -> None:
    torch.manual_seed(0)
    example, calib = _data(1, 3, 12, 12)
    compiled = etforge.compile(HardSigmoidGate().eval(), example, target=target, calibration=calib)
    assert not _without_kernel(compiled.pte, target)
    assert compiled.verify(samples=4).ok


def test_lstm_is_decomposed_and_runs() -> None:
    torch.manual_seed(0)
    example, calib = _data(1, 5, 6)
    compiled = etforge.compile(Lstm().eval(), example, target="cortex-m33", calibration=calib)
    assert "cortex_m::quantized_linear.out" in _program_ops(compiled.pte)  # its gates, int8
    assert not _without_kernel(compiled.pte, "cortex-m33")
    assert [f["where"] for f in compiled.report["fallbacks"] if f["stage"] == "kernels"] == [
        "aten.lstm.input"
    ]
    assert compiled.verify(samples=4).ok


def test_fft_is_refused_naming_node_op_and_libraries() -> None:
    torch.manual_seed(0)
    example, calib = _data(1, 16)
    with pytest.raises(EtforgeError) as err:
        etforge.compile(Fft().eval(), example, target="cortex-m33", calibration=calib)
    msg = str(err.value)
    assert "aten::_fft_r2c.out" in msg and "aten__fft_r2c_default" in msg
    assert "CMSIS-NN" in msg and "portable" in msg and "\n" not in msg


def test_custom_op_without_out_variant_is_refused() -> None:
    torch.manual_seed(0)
    example, calib = _data(1, 8)
    with pytest.raises(EtforgeError) as err:
        etforge.compile(CustomOp().eval(), example, target="imxrt700", calibration=calib)
    msg = str(err.value)
    assert "etforge_test::twice" in msg and "no out variant" in msg and "portable" in msg


def test_float64_module_is_compiled_as_float32_with_a_note() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 3)).double().eval()
    example, calib = _data(1, 8)
    compiled = etforge.compile(
        model, tuple(t.double() for t in example), target="cortex-m33",
        calibration=[tuple(t.double() for t in b) for b in calib],
    )  # fmt: skip
    assert any("float64" in n for n in compiled.report["notes"])
    assert compiled.report["inputs"][0]["dtype"] == "float32"
    assert compiled.verify(samples=4).ok


def test_float64_program_is_refused_clearly() -> None:
    from etforge.core.build.session import compile_model

    model = nn.Linear(4, 2).double().eval()
    example = (torch.randn(1, 4, dtype=torch.float64),)
    program = torch.export.export(model, example)
    with pytest.raises(EtforgeError, match="float64"):
        compile_model(None, example, "imxrt700", program=program)


def test_ceil_mode_max_pool_on_cortex_m_verifies() -> None:
    """The pool stays a portable op on int8 channels-last data, which torch's CPU kernel refuses
    on the host (its plane-size check uses the element type); the device kernel takes it."""
    torch.manual_seed(0)
    example, calib = _data(1, 3, 16, 16)
    compiled = etforge.compile(CeilPool().eval(), example, target="cortex-m33", calibration=calib)
    assert "aten::max_pool2d_with_indices.out" in _program_ops(compiled.pte)
    assert compiled.verify(samples=4).ok


def test_cli_refusal_writes_no_program(tmp_path: Path) -> None:
    factory = tmp_path / "fft_model.py"
    factory.write_text(
        "import torch\n"
        "class M(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.fft.rfft(x).abs()\n"
        "def make():\n"
        "    return M(), (torch.randn(1, 16),)\n"
    )
    out = tmp_path / "out"
    proc = run_cli("compile", f"{factory}:make", "--target", "imxrt700", "-o", str(out))
    assert proc.returncode == 1, proc.stderr
    text = proc.stdout + proc.stderr
    assert "aten::_fft_r2c.out" in text and "Traceback" not in text
    assert "--allow-missing" not in text
    assert not (out / "model.pte").exists()
