"""Every value that reaches the firmware is the program's (issue 48): codegen reads I/O
quantization, scratch and NPU working memory from the ``.pte``, and ``verify`` fails, naming the
field, on a report.json whose copy of any of them was forged."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from etforge.codegen import generate
from etforge.core.build import output
from etforge.core.build.report import build_report
from etforge.core.build.session import compile_model
from etforge.core.common.errors import EtforgeError
from etforge.core.registry.manager import registry
from etforge.runtime.verification.verify import verify

from support import conv_head


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An NPU program (imxrt700) and a CMSIS-NN one with scratch buffers (cortex-m33)."""
    reg = registry()
    model, calib = conv_head()
    out = {}
    for target in ("imxrt700", "cortex-m33"):
        result = compile_model(model, calib[0], target, calibration=calib, reg=reg)
        d = tmp_path_factory.mktemp(target)
        output.write_outputs(d, result, build_report(result, reg, "conv_head"))
        out[target] = d
    return out


def _forge(src: Path, dest: Path, edit: Any) -> Path:
    shutil.copytree(src, dest)
    report = json.loads((dest / "report.json").read_text())
    edit(report)
    (dest / "report.json").write_text(json.dumps(report))
    return dest


FORGERIES = {
    "io_quant.inputs[0].scale": ("imxrt700", lambda r: r["io_quant"]["inputs"][0].update(scale=0.5)),
    "io_quant.inputs[0].zero_point": ("imxrt700", lambda r: r["io_quant"]["inputs"][0].update(zero_point=7)),
    "io_quant.outputs[0].scale": ("cortex-m33", lambda r: r["io_quant"]["outputs"][0].update(scale=1.0)),
    "memory.arena_bytes": ("imxrt700", lambda r: r["memory"].update(arena_bytes=[16])),
    "memory.scratch": ("cortex-m33", lambda r: r["memory"]["scratch"][0].update(bytes=1)),
    "memory.npu_partitions[0].working_bytes": (
        "imxrt700",
        lambda r: r["memory"]["npu_partitions"][0].update(working_bytes=64),
    ),
    "memory.npu_partitions[0].fallback_arena_bytes": (
        "imxrt700",
        lambda r: r["memory"]["npu_partitions"][0].update(fallback_arena_bytes=64),
    ),
    "inputs[0].shape": ("imxrt700", lambda r: r["inputs"][0].update(shape=[1, 3, 4, 4])),
    "memory.pte_bytes": ("cortex-m33", lambda r: r["memory"].update(pte_bytes=1)),
}


@pytest.mark.parametrize("field", list(FORGERIES))
def test_a_forged_field_fails_verify_naming_it(programs: dict[str, Path], tmp_path: Path, field: str) -> None:
    target, edit = FORGERIES[field]
    out = _forge(programs[target], tmp_path / "out", edit)
    with pytest.raises(EtforgeError) as err:
        verify(out, samples=2)
    message = str(err.value)
    assert f"report.json {field}" in message and "\n" not in message, message


def test_codegen_takes_the_programs_figures_not_the_reports(
    programs: dict[str, Path], tmp_path: Path
) -> None:
    for target, src in programs.items():
        plain = generate(src / "model.pte", tmp_path / f"{target}-plain")
        report = json.loads((src / "report.json").read_text())
        assert report["memory"]["scratch"] or target == "imxrt700"  # cortex-m33 has scratch to forge

        def forge(r: dict[str, Any]) -> None:
            r["io_quant"]["inputs"][0].update(scale=0.5, zero_point=7)
            r["io_quant"]["outputs"][0].update(scale=0.25, zero_point=3)
            for s in r["memory"]["scratch"]:
                s["bytes"] = 1
            for p in r["memory"]["npu_partitions"]:
                p["working_bytes"] = 64

        forged = _forge(src, tmp_path / f"{target}-forged", forge)
        again = generate(forged / "model.pte", tmp_path / f"{target}-gen")
        assert again.files == plain.files, target
        header = next(v for k, v in plain.files.items() if k.endswith(".h")).decode()
        q = report["io_quant"]["inputs"][0]
        assert f"kInput0ZeroPoint = {q['zero_point']};" in header  # the compile's, as the program holds it
        scratch = sum(s["bytes"] for s in report["memory"]["scratch"])
        assert f"kScratchBytes = {scratch};" in header


def test_an_unforged_report_matches_its_program(programs: dict[str, Path]) -> None:
    from etforge.codegen.pte import read_program
    from etforge.runtime.verification.report_fields import mismatches

    for src in programs.values():
        pte = src / "model.pte"
        assert mismatches(read_program(pte).program, pte, json.loads((src / "report.json").read_text())) == []
