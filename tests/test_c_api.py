"""``etforge codegen --c-api NAME``: the C API, the embedded program and its buffers are the
same bytes every time, carry no user path, and refuse names that are not C identifiers."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest
from shared_outputs import compile_once

from support import run_cli


@pytest.fixture(scope="module")
def pte(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("capi") / 'o w"eird$dir'
    proc = compile_once("zoo:digits_cnn", "--target", "cortex-m33", out=out)  # a copy into the odd path
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out / "model.pte"


def test_c_api_is_deterministic_and_path_free(pte: Path, tmp_path: Path) -> None:
    for d in ("a", "b"):
        proc = run_cli(
            "codegen", str(pte), "-o", str(tmp_path / d), "--c-api", "mnist", "--namespace", "fw::mnist"
        )
        assert proc.returncode == 0, proc.stderr
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert {
        "mnist_api.h",
        "mnist_api.cpp",
        "mnist_pte.S",
        "mnist.pte",
        "mnist_kernels.cpp",
        "mnist.h",
    } <= set(names)
    match, mismatch, errors = filecmp.cmpfiles(tmp_path / "a", tmp_path / "b", names, shallow=False)
    assert not mismatch and not errors
    assert (tmp_path / "a" / "mnist.pte").read_bytes() == pte.read_bytes()
    for name in names:
        if name != "mnist.pte":
            text = (tmp_path / "a" / name).read_text()
            assert "weird" not in text and str(tmp_path) not in text, name
    header = (tmp_path / "a" / "mnist_api.h").read_text()
    assert "etforge_status mnist_run(const float* input0, float* output0);" in header


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--c-api", "int"], "NAME 'int' is a C/C++ keyword"),
        (["--c-api", "__x"], "reserved to the C implementation"),
        (["--c-api", "a-b"], "NAME 'a-b' is not a C identifier"),
        (["--c-api", "ok", "--pte-section", '.x"y'], "SECTION '.x\"y' is not a section name"),
        (["--c-api", "ok", "--namespace", "a::int"], "NAMESPACE 'a::int' is not a C++ namespace"),
        (["--pte-section", ".x"], "section options need --c-api NAME"),
    ],
)
def test_bad_names_are_one_error(pte: Path, tmp_path: Path, args: list[str], needle: str) -> None:
    proc = run_cli("codegen", str(pte), "-o", str(tmp_path / "g"), *args)
    assert proc.returncode != 0
    assert needle in proc.stderr
    assert not (tmp_path / "g").exists()
