"""Writing a compile's outputs so that a failed run never leaves a valid-looking ``model.pte``."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from etforge.core.compiler import CompileResult

PTE = "model.pte"
REPORT = "report.json"
FLOAT_PROGRAM = "float.pt2"
QUANTIZED_PROGRAM = "quantized.pt2"


def _umask_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, _umask_mode())  # mkstemp creates 0600; outputs are ordinary files
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def clear_previous(out: Path) -> None:
    """Before compiling: the old program must not survive a failed run looking current."""
    for name in (PTE, REPORT):
        (out / name).unlink(missing_ok=True)


def write_outputs(out: Path, result: CompileResult, report: dict[str, Any]) -> None:
    """Partitions and programs first, the report next, ``model.pte`` last."""
    out.mkdir(parents=True, exist_ok=True)
    parts = out / "partitions"
    if parts.exists():
        for old in parts.glob("*.tflite"):
            old.unlink()
    for old in parts.glob("*_kernel_selection.c") if parts.exists() else []:
        old.unlink()
    for p in result.partitions:
        _atomic_write(parts / f"{p.name}.tflite", p.converted.tflite)
        if p.payload.kernel_selection is not None:  # the eIQ Neutron SDK's, for codegen to merge
            _atomic_write(parts / f"{p.name}_kernel_selection.c", p.payload.kernel_selection.encode())
    for name, program in (
        (FLOAT_PROGRAM, result.float_program),
        (QUANTIZED_PROGRAM, result.quantized_program),
    ):
        target = out / name
        if program is None:
            target.unlink(missing_ok=True)
            continue
        fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{name}.", suffix=".pt2")
        os.close(fd)
        try:
            torch.export.save(program, tmp)
            os.chmod(tmp, _umask_mode())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    _atomic_write(out / REPORT, (json.dumps(report, indent=2, sort_keys=False) + "\n").encode())
    _atomic_write(out / PTE, result.pte)


ETRECORD = "model.etrecord"


def write_etrecord(out: Path, result: CompileResult) -> None:
    """ExecuTorch devtools' ETRecord: the Edge program, the .pte and the delegates' debug maps."""
    from executorch.devtools import generate_etrecord

    fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{ETRECORD}.")
    os.close(fd)
    try:
        program = result.quantized_program if result.quantized_program is not None else result.float_program
        generate_etrecord(tmp, result.edge, result.executorch, exported_program=program)
        os.chmod(tmp, _umask_mode())
        os.replace(tmp, out / ETRECORD)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
