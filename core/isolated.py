"""Run a vendor toolchain call in a child process, so that its crash cannot take etforge down.

The child runs ``module:function(input_bytes, **kwargs) -> bytes`` with the input and
output passed through files; a non-zero exit (segfault, abort, exception) becomes an
:class:`EtforgeError` that names what was being compiled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from etforge.core.errors import EtforgeError


def run_isolated(
    function: str, data: bytes, what: str, timeout: float = 3600, **kwargs: Any
) -> tuple[bytes, str, dict[str, bytes]]:
    """Call ``function`` ("pkg.module:func") in a child; returns (output, log, files it wrote)."""
    with tempfile.TemporaryDirectory(prefix="etforge-npu-") as tmp:
        work = Path(tmp)
        (work / "input.bin").write_bytes(data)
        (work / "kwargs.json").write_text(json.dumps(kwargs))
        cmd = [sys.executable, "-m", "etforge.core.isolated", function, str(work)]
        try:
            proc = subprocess.run(
                cmd, cwd=work, capture_output=True, text=True, timeout=timeout, env=dict(os.environ)
            )
        except subprocess.TimeoutExpired:
            raise EtforgeError(f"{what}: {function} did not finish within {timeout:.0f} s") from None
        log = proc.stdout + proc.stderr
        if proc.returncode != 0 or not (work / "output.bin").exists():
            reason = f"signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
            tail = "\n".join(log.strip().splitlines()[-8:])
            raise EtforgeError(f"{what}: {function} crashed ({reason})" + (f":\n{tail}" if tail else ""))
        files = {
            p.name: p.read_bytes()
            for p in work.iterdir()
            if p.name not in {"input.bin", "output.bin", "kwargs.json"}
        }
        return (work / "output.bin").read_bytes(), log, files


def _child(function: str, work: str) -> None:
    import importlib

    module_name, func_name = function.split(":")
    func = getattr(importlib.import_module(module_name), func_name)
    wd = Path(work)
    out = func((wd / "input.bin").read_bytes(), **json.loads((wd / "kwargs.json").read_text()))
    (wd / "output.bin").write_bytes(bytes(out))


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
