"""The remaining error paths: each names its culprit, exits 1, and prints no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from etforge.codegen import generate
from etforge.core.common.errors import EtforgeError
from etforge.core.front.load import check_calibration, load_calibration

from support import run_cli


def _fails(*args: str, code: int = 1) -> str:
    proc = run_cli(*args)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stderr


def test_verify_and_report_without_a_compile(tmp_path: Path) -> None:
    assert "no compiled program here" in _fails("verify", str(tmp_path))
    assert "no report.json here" in _fails("report", str(tmp_path), "--ops")


def test_codegen_rejects_bad_names_and_libraries(tmp_path: Path) -> None:
    pte = tmp_path / "x.pte"
    pte.write_bytes(b"\x00" * 64)
    with pytest.raises(EtforgeError, match="--namespace 'not a namespace'.* is not a C/C\\+\\+ identifier"):
        generate(pte, tmp_path / "g", namespace="not a namespace")
    with pytest.raises(EtforgeError, match="--prefix '9lives' is not a C/C\\+\\+ identifier"):
        generate(pte, tmp_path / "g", prefix="9lives")
    assert "does not exist" in _fails("codegen", str(tmp_path / "missing.pte"), "-o", str(tmp_path / "g"))


def test_unknown_kernel_library(tmp_path: Path) -> None:
    from etforge import zoo
    from etforge.core.build.session import compile_model

    model, example = zoo.build("autoencoder")
    pte = tmp_path / "model.pte"
    pte.write_bytes(compile_model(model, example, "imxrt700", calibration=[example]).pte)
    with pytest.raises(EtforgeError, match="unknown kernel libraries cmsis; known: .*portable"):
        generate(pte, tmp_path / "g", libraries=("cmsis",))


def test_bad_calibration_files(tmp_path: Path) -> None:
    example = (torch.randn(1, 4),)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a torch file")
    with pytest.raises(EtforgeError, match="junk.pt: cannot load"):
        load_calibration(str(junk), example)
    with pytest.raises(EtforgeError, match="does not exist"):
        load_calibration(str(tmp_path / "none.pt"), example)
    with pytest.raises(EtforgeError, match="calibration data is empty"):
        check_calibration([], example, "calib")
    with pytest.raises(EtforgeError, match="batch 0 has 2 inputs, the model takes 1"):
        check_calibration([(torch.randn(1, 4), torch.randn(1, 4))], example, "calib")


def test_bad_option_values(tmp_path: Path) -> None:
    err = _fails(
        "compile",
        "zoo:cifarnet",
        "--target",
        "cortex-m33",
        "-o",
        str(tmp_path / "o"),
        "--option",
        "isa=avx",
        code=2,
    )
    assert "option 'isa' must be one of auto, scalar, dsp, mve" in err
    err = _fails(
        "compile",
        "zoo:cifarnet",
        "--target",
        "imxrt700",
        "-o",
        str(tmp_path / "o"),
        "--option",
        "min_partition_ops=x",
        code=2,
    )
    assert "option 'min_partition_ops' takes an integer" in err
    err = _fails("compile", "zoo:nonet", "-o", str(tmp_path / "o"))
    assert "unknown zoo model 'nonet'" in err and "cifarnet" in err
