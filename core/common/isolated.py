"""Run a vendor toolchain call in a child process, so that its crash cannot take etforge down.

The child runs ``module:function(input_bytes, **kwargs) -> bytes`` with the input and
output passed through files in a private working directory (files the call writes there
come back too). Whatever goes wrong becomes one :class:`EtforgeError` naming what was being
compiled: the call's own exception (type and message), the signal that killed it, or the
time limit it overran -- the child and anything it started are killed then.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

from etforge.core.common.errors import EtforgeError

_RESERVED = {"input.bin", "output.bin", "kwargs.json", "error.txt"}


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"


def run_isolated(
    function: str,
    data: bytes,
    what: str,
    timeout: float = 3600,
    timeout_hint: str = "",
    **kwargs: Any,
) -> tuple[bytes, str, dict[str, bytes]]:
    """Call ``function`` ("pkg.module:func") in a child; returns (output, log, files it wrote)."""
    with tempfile.TemporaryDirectory(prefix="etforge-npu-") as tmp:
        work = Path(tmp)
        (work / "input.bin").write_bytes(data)
        (work / "kwargs.json").write_text(json.dumps(kwargs))
        cmd = [sys.executable, "-m", "etforge.core.common.isolated", function, str(work)]
        # A session of its own: on timeout the whole group goes (an SDK may start helpers).
        proc = subprocess.Popen(
            cmd,
            cwd=work,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(os.environ),
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            hint = f" ({timeout_hint})" if timeout_hint else ""
            raise EtforgeError(f"{what} did not finish within {timeout:g} s and was killed{hint}") from None
        except BaseException:
            _kill_group(proc)
            proc.communicate()
            raise
        log = out + err
        error = work / "error.txt"
        if error.is_file():
            raise EtforgeError(f"{what} failed: {error.read_text().strip()}")
        if proc.returncode != 0 or not (work / "output.bin").exists():
            code = proc.returncode
            cause = f"signal {-code}) [{_signal_name(-code)}]" if code < 0 else f"exit code {code})"
            tail = "\n".join(log.strip().splitlines()[-8:])
            raise EtforgeError(f"{what} crashed ({cause}" + (f":\n{tail}" if tail else ""))
        files = {p.name: p.read_bytes() for p in sorted(work.iterdir()) if p.name not in _RESERVED}
        return (work / "output.bin").read_bytes(), log, files


def _child(function: str, work: str) -> None:
    import importlib

    wd = Path(work)
    try:
        module_name, func_name = function.split(":")
        func = getattr(importlib.import_module(module_name), func_name)
        out = func((wd / "input.bin").read_bytes(), **json.loads((wd / "kwargs.json").read_text()))
    except BaseException as exc:  # SystemExit too: the parent reports it as the call's failure
        traceback.print_exc()
        lines = str(exc).strip().splitlines()
        first = lines[0] if lines else ""
        text = first if isinstance(exc, SystemExit) and first else f"{type(exc).__name__}: {first}"
        (wd / "error.txt").write_text(text.rstrip(": "))
        sys.exit(1)
    (wd / "output.bin").write_bytes(bytes(out))


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
