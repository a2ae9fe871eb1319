"""Run a firmware image under ``qemu-system-arm -M mps2-an505`` and read what it reports.

The image talks to the host through semihosting only: it reads ``model.pte`` and the input
files from QEMU's working directory and writes the outputs there; its ``etforge:`` lines
(``files/runner.cpp``) carry the planned buffers it allocated and the SysTick ticks of each
inference. QEMU runs with ``-icount shift=0``: one virtual nanosecond per guest instruction,
so SysTick (on the processor clock) counts instructions, a fixed number per tick which the
image measures on a loop of known length before the model runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from etforge.core.common.errors import EtforgeError

MACHINE = ("-M", "mps2-an505", "-cpu", "cortex-m33")
#: What the instruction figures are (printed beside every one of them).
INSTRUCTION_LABEL = "emulator instruction count (QEMU -icount), not device cycles"
#: Seconds one QEMU run may take before it is killed and treated as hung (a wedged image never
#: exits); ``$ETFORGE_QEMU_TIMEOUT`` overrides it.
TIMEOUT_SECONDS = 1800
ENV_TIMEOUT = "ETFORGE_QEMU_TIMEOUT"


def timeout_seconds() -> float:
    raw = os.environ.get(ENV_TIMEOUT)
    if not raw:
        return TIMEOUT_SECONDS
    try:
        value = float(raw)
    except ValueError:
        raise EtforgeError(f"${ENV_TIMEOUT}={raw!r}: not a number of seconds") from None
    if value <= 0:
        raise EtforgeError(f"${ENV_TIMEOUT}={raw!r}: must be positive")
    return value


@dataclass
class QemuRun:
    planned: list[int] = field(default_factory=list)  #: bytes ExecuTorch planned, per memory id
    arena: list[int] = field(default_factory=list)  #: bytes the image's arena holds, per memory id
    ticks: list[int] = field(default_factory=list)  #: per sample
    instructions_per_tick: int = 0
    method_allocator_bytes: int = 0
    #: First sample: (event name, ticks) per event ExecuTorch's event tracer profiled, in order.
    events: list[tuple[str, int]] = field(default_factory=list)
    #: Per host-only partition run in TFLite Micro on the CPU: (TFLM arena bytes, bytes used).
    tflm_arenas: list[tuple[int, int]] = field(default_factory=list)
    log: str = ""

    @property
    def instructions(self) -> list[int]:
        return [t * self.instructions_per_tick for t in self.ticks]


def check_qemu() -> str:
    exe = shutil.which("qemu-system-arm")
    if exe is None:
        raise EtforgeError("qemu-system-arm not found on PATH (Debian: apt-get install qemu-system-arm)")
    return exe


def run(
    elf: Path,
    workdir: Path,
    samples: int,
    pte_name: str = "model.pte",
    describe: Callable[[int], str] | None = None,
) -> QemuRun:
    """Run ``elf`` on ``samples`` input sets in ``workdir`` (``s<i>_in<j>.bin``); the outputs
    are left there as ``s<i>_out<j>.bin``. ``describe`` names the plan's instruction N (the
    one a failed execute stopped in)."""
    cmd = [
        check_qemu(), *MACHINE, "-nographic", "-monitor", "none", "-icount", "shift=0",
        "-semihosting-config", "enable=on,target=native", "-kernel", str(elf.resolve()),
        "-append", f"{pte_name} {samples}",
    ]  # fmt: skip
    limit = timeout_seconds()
    try:
        proc = subprocess.run(cmd, cwd=workdir, capture_output=True, timeout=limit)
    except subprocess.TimeoutExpired as e:  # subprocess.run has killed QEMU
        raise EtforgeError(
            f"QEMU did not finish {elf} within {limit:g} s and was stopped (hung image? a longer "
            f"program needs a larger ${ENV_TIMEOUT})"
        ) from e
    stdout = proc.stdout.decode(errors="replace")  # a log line may carry a tensor's raw bytes
    log = stdout + proc.stderr.decode(errors="replace")
    result = QemuRun(log=log)
    for line in log.splitlines():
        if m := re.match(r"etforge: planned buffer (\d+) (\d+) bytes arena (\d+) bytes", line):
            result.planned.append(int(m.group(2)))
            result.arena.append(int(m.group(3)))
        elif m := re.match(r"etforge: calibration (\d+) instructions (\d+) ticks", line):
            insns, ticks = int(m.group(1)), int(m.group(2))
            result.instructions_per_tick = round(insns / ticks) if ticks else 0
        elif m := re.match(r"etforge: sample (\d+) (\d+) ticks", line):
            result.ticks.append(int(m.group(2)))
        elif m := re.match(r"etforge: event \d+ (\S+) (\d+) ticks", line):
            result.events.append((m.group(1), int(m.group(2))))
        elif m := re.match(r"etforge: tflm partition \d+ arena (\d+) bytes used (\d+) bytes", line):
            result.tflm_arenas.append((int(m.group(1)), int(m.group(2))))
        elif m := re.match(r"etforge: method allocator (\d+) bytes", line):
            result.method_allocator_bytes = int(m.group(1))
    if "etforge: ok" not in stdout:
        where = ""
        failed = re.search(r"^etforge: failed instruction (\d+)$", stdout, re.MULTILINE)
        if failed and describe is not None:
            where = f" in {describe(int(failed.group(1)))}"
        raise EtforgeError(f"the image failed under QEMU{where}: {_first_error(log, proc.returncode)}")
    return result


def _first_error(log: str, rc: int) -> str:
    """The runner's own error line, else ExecuTorch's first fatal/error log line, else the tail."""
    lines = log.splitlines()
    mine = next(
        (ln.removeprefix("etforge: error: ") for ln in lines if ln.startswith("etforge: error:")), None
    )
    et = next((ln for ln in lines if ln.startswith("[ET F]")), None) or next(
        (ln for ln in lines if ln.startswith("[ET E]")), None
    )
    if et is not None:
        kind = "ExecuTorch abort" if et.startswith("[ET F]") else "ExecuTorch error"
        et = f"{kind}: {et[7:].strip()}"
    if mine and et:
        return f"{mine} ({et})"
    if mine or et:
        return str(mine or et)
    tail = " | ".join(lines[-3:]) if lines else "no output"
    return f"QEMU exited with code {rc} before the runner finished ({tail})"
