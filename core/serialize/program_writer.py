"""``float.pt2``, ``quantized.pt2`` and the lowered program written by forked children while
the parent compiles.

``torch.export.save`` spends seconds serializing (and deep-copying) a model's graph, and each
program is final long before the compile ends: the float program once the graph rewrites are
done, the quantized one when quantization is. A ``fork`` per file writes each on the second
core as soon as it is final (the float program while the parent quantizes, the quantized one
while it lowers, the lowered Edge program, ``core.serialize.lowered_program``, while it
serializes the ``.pte``), and the parent waits for them before the output is swapped in. Where
``fork`` is missing (not POSIX) the parent writes them itself, at the end. A failed or killed
child fails the compile naming the files; a rebuild (the kernel check decomposes and
compiles again) cancels the children of programs that changed and starts new ones. A child
answers the serializers' Inductor import with a stand-in (``core.serialize.inductor_stand_in``:
a quarter of a child's CPU on resnet18); the parent, where other threads may compile, does not.
"""

from __future__ import annotations

import os
import signal
import traceback
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from torch.export import ExportedProgram

from etforge.core.common.errors import EtforgeError

_ERROR = ".programs-error"


def save_program(program: ExportedProgram, path: Path) -> None:
    """``torch.export.save`` into memory, then the bytes to ``path`` with Python's ``open``:
    any path works (non-UTF-8 ones too), and a full disk is an ``OSError`` naming the file,
    not an abort inside torch's zip writer."""
    import io

    import torch

    from etforge.core.serialize.stable_provenance import numbered_graphs

    buf = io.BytesIO()
    with numbered_graphs(program):  # graph numbers, not addresses: the same bytes every run
        torch.export.save(program, buf)
    with open(path, "wb") as f:
        f.write(buf.getbuffer())


def _one_line(exc: BaseException) -> str:
    """Why a program could not be written (an OSError's file and reason: a full disk)."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}" + (f" ({os.fsdecode(exc.filename)})" if exc.filename else "")
    lines = (traceback.format_exception_only(type(exc), exc)[-1] or "").strip().splitlines()
    return lines[-1] if lines else type(exc).__name__


class ProgramWriter:
    """Writes the programs of the latest :meth:`start` into ``out``; :meth:`finish` joins."""

    def __init__(self, out: Path, names: tuple[str, str], lowered: str | None = None) -> None:
        self.out = Path(out)
        self.names = names
        #: The lowered program's file name (:meth:`start_lowered`); None: not written here.
        self.lowered = lowered
        #: file name -> (child pid, the program it writes)
        self._jobs: dict[str, tuple[int, ExportedProgram]] = {}
        #: file name -> (program, its writer), written by :meth:`finish` where fork is missing
        self._pending: dict[str, tuple[ExportedProgram, Callable[[ExportedProgram, Path], None]]] = {}

    def start(self, float_program: ExportedProgram | None, quantized: ExportedProgram | None) -> None:
        """Write these programs (``None``: no such file); a program already being written goes on."""
        for name, program in zip(self.names, (float_program, quantized), strict=True):
            self._start(name, program, save_program)

    def start_lowered(self, program: ExportedProgram) -> None:
        """Write the lowered Edge program (``core.serialize.lowered_program``) as ``lowered``."""
        from etforge.core.serialize.lowered_program import save_lowered

        if self.lowered is None:
            raise ValueError("this writer was given no file name for the lowered program")
        self._start(self.lowered, program, save_lowered)

    def _start(
        self, name: str, program: ExportedProgram | None, save: Callable[[ExportedProgram, Path], None]
    ) -> None:
        job = self._jobs.get(name)
        current = job[1] if job is not None else self._pending.get(name, (None,))[0]
        if program is not None and current is program:
            return
        self._cancel(name)
        if program is None:
            return
        if not hasattr(os, "fork"):
            self._pending[name] = (program, save)
            return
        pid = os.fork()
        if pid == 0:  # the child: write, report, leave without running the parent's cleanup
            code = 0
            try:
                import torch

                from etforge.core.serialize.inductor_stand_in import stand_in

                torch.set_num_threads(1)  # the parent's thread pool does not survive a fork
                with stand_in():  # one thread here: the serializers' Inductor import answered
                    save(program, self.out / name)
            except BaseException as exc:
                # an OSError's errno is the exit status: the reason survives a disk too full
                # to take the error file below
                code = exc.errno if isinstance(exc, OSError) and exc.errno and 1 < exc.errno < 126 else 1
                try:  # one line (the partial file goes first: on a full disk it frees the room)
                    (self.out / name).unlink(missing_ok=True)
                    (self.out / f"{_ERROR}-{name}").write_text(_one_line(exc))
                except OSError:
                    pass
            finally:
                os._exit(code)
        self._jobs[name] = (pid, program)

    def finish(self) -> None:
        """Wait for the children (or write now); a failure is an error naming the files."""

        for name, (program, save) in list(self._pending.items()):
            try:
                save(program, self.out / name)
            except OSError as exc:
                raise EtforgeError(f"could not write {self.out / name}: {_one_line(exc)}") from None
        self._pending.clear()
        failed: list[str] = []
        detail = ""
        for name in self._all_names():
            job = self._jobs.pop(name, None)
            if job is None:
                continue
            _, status = os.waitpid(job[0], 0)
            if os.waitstatus_to_exitcode(status) == 0:
                continue
            failed.append(name)
            err = self.out / f"{_ERROR}-{name}"
            written = ""
            try:
                written = err.read_text().strip()
                err.unlink()
            except OSError:
                pass
            code = os.waitstatus_to_exitcode(status)
            status_line = (
                f"{os.strerror(code)} ({self.out / name})"
                if 1 < code < 126
                else f"the writer process ended with status {code}"
            )
            detail = detail or (written.splitlines() or [status_line])[-1]
        if failed:
            raise EtforgeError(f"could not write {' and '.join(failed)} into {self.out}: {detail}")

    def _cancel(self, name: str) -> None:
        self._pending.pop(name, None)
        job = self._jobs.pop(name, None)
        if job is None:
            return
        try:
            os.kill(job[0], signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(job[0], 0)
        for path in (self.out / name, self.out / f"{_ERROR}-{name}"):
            path.unlink(missing_ok=True)

    def _all_names(self) -> tuple[str, ...]:
        return (*self.names, self.lowered) if self.lowered is not None else self.names

    def cancel(self) -> None:
        for name in self._all_names():
            self._cancel(name)

    def __enter__(self) -> ProgramWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if kind is not None:
            self.cancel()
