"""Every second-best path a compile takes is recorded (report.json ``fallbacks``, the summary)
and ``--no-fallback`` / ``strict=True`` refuses it, writing nothing (core/common/fallbacks.py).

The LSTM is the fallback every CPU target takes today: no kernel library provides
``aten::lstm``, so it is decomposed into ops that have kernels. The zoo and the architecture
suite compile with no fallback at all (strict), on every target.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from models.architectures import FAMILIES, build
from torch import nn

import etforge
from etforge import zoo
from etforge.core.build.summary import summary_lines
from etforge.core.common.fallbacks import StrictFallback

from support import run_cli

TARGETS = ("imxrt700", "imxrt700cm", "cortex-m33")

LSTM_MODEL = """
import torch


class Lstm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(6, 8, batch_first=True)
        self.fc = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.lstm(x)[0][:, -1])


def build():
    torch.manual_seed(0)
    return Lstm().eval(), (torch.randn(1, 5, 6),)
"""


class Lstm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(6, 8, batch_first=True)
        self.fc = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.lstm(x)[0][:, -1])


def _lstm() -> tuple[nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    calib = [(torch.randn(1, 5, 6, generator=g),) for _ in range(2)]
    return Lstm().eval(), calib[0], calib


def test_a_fallback_is_recorded_and_shown() -> None:
    model, example, calib = _lstm()
    compiled = etforge.compile(model, example, target="cortex-m33", calibration=calib)
    fb, *floats = compiled.report["fallbacks"]
    assert fb["stage"] == "kernels" and fb["where"] == "aten.lstm.input", fb
    # the decomposed cell's gates have no int8 form on cortex-m33: each told (float_ops.py)
    assert all(f["what"] == "runs in float on the CPU" for f in floats), floats
    assert "no kernel library of cortex-m33" in fb["why"]
    lines = summary_lines(compiled.report, width=300)
    assert any(line.startswith("fallback: ") and "aten.lstm.input" in line for line in lines), lines


def test_strict_refuses_the_fallback_naming_it() -> None:
    model, example, calib = _lstm()
    with pytest.raises(StrictFallback) as err:
        etforge.compile(model, example, target="cortex-m33", calibration=calib, strict=True)
    assert "aten.lstm.input" in str(err.value) and "\n" not in str(err.value)


def test_cli_no_fallback_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "lstm.py").write_text(LSTM_MODEL)
    out = tmp_path / "out"
    r = run_cli(
        "compile", f"{tmp_path / 'lstm.py'}:build", "--target", "cortex-m33", "-o", str(out),
        "--no-fallback", "--no-cache",
    )  # fmt: skip
    assert r.returncode == 1, r.stdout + r.stderr
    assert "aten.lstm.input" in r.stderr and "fallback" in r.stderr, r.stderr
    assert not out.exists()
    r = run_cli(
        "compile", f"{tmp_path / 'lstm.py'}:build", "--target", "cortex-m33", "-o", str(out), "--no-cache"
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "fallback: decomposed" in r.stdout and (out / "model.pte").is_file()


class LoneLinear(nn.Module):
    """A linear the NPU takes whole, alone in its partition: ``min_partition_ops=2`` refuses
    it after ExecuTorch kept it whole, so the classic path lowers again, decomposed."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(self.fc(x), 1)  # cumsum: no converter, the partition stays one op


def test_the_classic_relowering_is_a_recorded_decision() -> None:
    torch.manual_seed(0)
    model, example = LoneLinear().eval(), (torch.randn(1, 8),)
    options = {"min_partition_ops": 2}
    classic = etforge.compile(model, example, target="imxrt700", options=options, lowering="classic")
    # the refused linear and the cumsum run in float on imxrt700's CPU: told too, in both
    fb, *floats = classic.report["fallbacks"]
    assert fb["what"] == "re-lowered with every op decomposed" and "aten_linear_default" in fb["why"], fb
    assert {f["what"] for f in floats} == {"runs in float on the CPU"}, floats
    assert any("cumsum" in f["where"] for f in floats) and any("addmm" in f["where"] for f in floats)
    early = etforge.compile(model, example, target="imxrt700", options=options)
    assert early.pte == classic.pte
    # the same ops told (the early path names the linear by its ATen node, the classic by addmm)
    assert [f["why"] for f in early.report["fallbacks"]] == [f["why"] for f in floats]
    with pytest.raises(StrictFallback, match="re-lowered with every op decomposed"):
        etforge.compile(model, example, target="imxrt700", options=options, lowering="classic", strict=True)


#: The known fallbacks of the zoo and the architecture suite, asserted exactly, both ways (a
#: program that gains one fails): ExecuTorch's Cortex-M passes fail on a bmm fed by a folded
#: linear (int32 trace) and are re-run with the CMSIS-NN substitution moved up
#: (plugins/targets/cortex_m.py); ops the CPU quantizer gives no int8 form run in float on
#: the CPU (core/lower/float_ops.py: one "quantize" fallback per Edge op kind): the
#: transformer's LayerNorm statistics and residual adds on cortex-m33 and its exact GELU on
#: imxrt700; the mean over time after the 1-D convs on cortex-m33; the decomposed hardswish's
#: add, clamp and mul on cortex-m33.
EXPECTED: dict[tuple[str, str], list[str]] = {
    ("transformer", "cortex-m33"): ["cpu_lowering", "quantize", "quantize", "quantize", "quantize"],
    ("transformer", "imxrt700"): ["quantize"],
    ("audio_conv1d", "cortex-m33"): ["quantize"],  # its mean over time (the convs are int8)
    ("mobilenet_v3_se", "cortex-m33"): ["quantize", "quantize", "quantize"],
}

ZOO = sorted(zoo.ZOO)


@pytest.mark.parametrize("name", ZOO)
def test_zoo_compiles_without_fallback(name: str) -> None:
    model, example = zoo.build(name)
    calib = zoo.calibration(name, 2)
    for target in TARGETS:
        compiled = etforge.compile(model, example, target=target, calibration=calib, strict=True)
        assert compiled.report["fallbacks"] == []


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_architecture_compiles_without_fallback(family: str) -> None:
    model, example, calibration = build(family)
    for target in TARGETS:
        stage = EXPECTED.get((family, target))
        if stage is None:
            compiled = etforge.compile(
                model, example, target=target, calibration=calibration[:2], strict=True
            )
            assert compiled.report["fallbacks"] == []
            continue
        compiled = etforge.compile(model, example, target=target, calibration=calibration[:2])
        assert [f["stage"] for f in compiled.report["fallbacks"]] == stage, compiled.report["fallbacks"]
        with pytest.raises(StrictFallback, match=stage[0]):
            etforge.compile(model, example, target=target, calibration=calibration[:2], strict=True)


def test_a_strict_inner_recording_leaves_the_outer_as_it_was() -> None:
    from etforge.core.common.fallbacks import record, recording

    with recording() as outer:
        with recording(strict=True), pytest.raises(StrictFallback):
            record("lower", "a", "", "b")
        record("lower", "c", "", "d")  # the outer compile is not strict: recorded, not refused
    assert [f.what for f in outer.items] == ["c"]
