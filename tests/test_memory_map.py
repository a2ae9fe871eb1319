"""The firmware's buffers in report.json, ``compile --memory-map`` against a board's regions,
and firmware sources taken only from where the user points (no default outside the repo)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from shared_outputs import compile_once

from support import run_cli

REGIONS = """\
[flash]
size = "0x1FC000"
holds = ["program"]
[sram]
size = "{sram}"
holds = ["arena", "pools", "stack"]
[npu_sram]
size = "2M"
holds = ["npu"]
"""


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mm") / "o"
    proc = compile_once("zoo:digits_cnn", "--target", "cortex-m33", out=root)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return root


def test_report_lists_every_firmware_buffer(out: Path) -> None:
    report = json.loads((out / "report.json").read_text())
    buffers = {b["kind"]: b for b in report["memory"]["firmware_buffers"]}
    assert buffers["program"]["bytes"] == (out / "model.pte").stat().st_size
    arenas = [b for b in report["memory"]["firmware_buffers"] if b["kind"] == "arena" and not b.get("inside")]
    (scratch,) = [b for b in report["memory"]["firmware_buffers"] if b.get("inside")]
    assert scratch["bytes"] == sum(x["bytes"] for x in report["memory"]["scratch"]) > 0
    assert [b["bytes"] for b in arenas] == report["memory"]["arena_bytes"]
    basis = {b["buffer"]: b["basis"] for b in report["memory"]["firmware_buffers"]}
    assert basis["stack"] == "assumed" and basis["ExecuTorch method pool"] == "estimate"
    assert all(b["section"] for b in report["memory"]["firmware_buffers"])


def test_memory_map_fits_and_names_the_buffer_that_does_not(out: Path, tmp_path: Path) -> None:
    fits = tmp_path / "fits.toml"
    fits.write_text(REGIONS.format(sram="1536K"))
    proc = run_cli(
        "compile",
        "zoo:digits_cnn",
        "--target",
        "cortex-m33",
        "-o",
        str(tmp_path / "a"),
        "--memory-map",
        str(fits),
    )
    assert proc.returncode == 0, proc.stderr
    assert "region sram:" in proc.stdout and "arena memory id 1" in proc.stdout
    small = tmp_path / "small.toml"
    arena = json.loads((out / "report.json").read_text())["memory"]["arena_bytes"][0]
    small.write_text(REGIONS.format(sram=str(arena - 1)))
    proc = run_cli(
        "compile",
        "zoo:digits_cnn",
        "--target",
        "cortex-m33",
        "-o",
        str(tmp_path / "b"),
        "--memory-map",
        str(small),
    )
    assert proc.returncode == 1
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert "arena memory id 1" in line and "does not fit region sram" in line
    assert not (tmp_path / "b" / "model.pte").exists()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[flash\nsize = 1\n", "not valid TOML"),
        ('[flash]\nsize = "lots"\nholds = ["program"]\n', "is not a positive byte count"),
        ('[flash]\nsize = 10\nholds = ["bananas"]\n', "unknown buffer kind 'bananas'"),
        ('[flash]\nsize = 10\nholds = ["program"]\n', "no region holds 'arena'"),
    ],
)
def test_bad_memory_map_is_one_error(text: str, needle: str, out: Path, tmp_path: Path) -> None:
    path = tmp_path / "map.toml"
    path.write_text(text)
    proc = run_cli(
        "compile",
        "zoo:digits_cnn",
        "--target",
        "cortex-m33",
        "-o",
        str(tmp_path / "o"),
        "--memory-map",
        str(path),
    )
    assert proc.returncode == 1
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert needle in line and "map.toml" in line


def test_run_without_sources_names_what_to_set(out: Path) -> None:
    """A fresh clone: no ExecuTorch tree given (an empty variable is unset) -> one line saying what to set."""
    proc = run_cli(
        "run", str(out), "--on", "qemu-m33", env={"ETFORGE_EXECUTORCH_SRC": "", "ETFORGE_CMSIS_NN_SRC": ""}
    )
    assert proc.returncode == 1
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert "ETFORGE_EXECUTORCH_SRC" in line and "docs/firmware.md" in line
