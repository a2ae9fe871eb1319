"""``float.pt2`` and ``quantized.pt2`` written by a forked child while the parent lowers.

``torch.export.save`` spends seconds serializing (and deep-copying) a model's graph, and the
programs are final as soon as quantization ends: a ``fork`` writes them on the second core
while the parent lowers and serializes, and the parent waits for it before the output is
swapped in. Where ``fork`` is missing (not POSIX) the parent writes them itself, at the end.
A failed or killed child fails the compile naming the file; a rebuild (the kernel check
decomposes and compiles again) cancels the child and starts one on the new programs.
"""

from __future__ import annotations

import os
import signal
import traceback
from pathlib import Path
from types import TracebackType

from torch.export import ExportedProgram

from etforge.core.errors import EtforgeError

_ERROR = ".programs-error"


class ProgramWriter:
    """Writes the programs of the latest :meth:`start` into ``out``; :meth:`finish` joins."""

    def __init__(self, out: Path, names: tuple[str, str]) -> None:
        self.out = Path(out)
        self.names = names
        self._pid: int | None = None
        self._pending: tuple[ExportedProgram | None, ExportedProgram | None] | None = None

    def start(self, float_program: ExportedProgram | None, quantized: ExportedProgram | None) -> None:
        self.cancel()
        programs = (float_program, quantized)
        if not hasattr(os, "fork"):
            self._pending = programs
            return
        pid = os.fork()
        if pid == 0:  # the child: write, report, leave without running the parent's cleanup
            code = 0
            try:
                import torch

                torch.set_num_threads(1)  # the parent's thread pool does not survive a fork
                self._write(programs)
            except BaseException:
                code = 1
                try:
                    (self.out / _ERROR).write_text(traceback.format_exc())
                except OSError:
                    pass
            finally:
                os._exit(code)
        self._pid = pid

    def _write(self, programs: tuple[ExportedProgram | None, ExportedProgram | None]) -> None:
        import torch

        for name, program in zip(self.names, programs, strict=True):
            if program is not None:
                torch.export.save(program, str(self.out / name))

    def finish(self) -> None:
        """Wait for the child (or write now); a failure is an error naming the files."""
        if self._pending is not None:
            programs, self._pending = self._pending, None
            self._write(programs)
            return
        if self._pid is None:
            return
        pid, self._pid = self._pid, None
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            detail = ""
            err = self.out / _ERROR
            if err.exists():
                detail = err.read_text().strip().splitlines()[-1]
                err.unlink()
            else:
                detail = f"the writer process ended with status {os.waitstatus_to_exitcode(status)}"
            raise EtforgeError(f"could not write {' and '.join(self.names)} into {self.out}: {detail}")

    def cancel(self) -> None:
        self._pending = None
        if self._pid is None:
            return
        pid, self._pid = self._pid, None
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)
        for name in (*self.names, _ERROR):
            (self.out / name).unlink(missing_ok=True)

    def __enter__(self) -> ProgramWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is not None:
            self.cancel()
