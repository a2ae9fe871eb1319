"""A compile's output directory, replaced whole: the old result stays until the new one is complete.

Everything is built in a sibling staging directory (``OUT.tmp-<pid>-<random>``, same file
system) and swapped in at the end: an atomic exchange where the kernel has one
(``renameat2(RENAME_EXCHANGE)``), else renames through ``OUT.new-*`` / ``OUT.old-*``.
A run killed at any point leaves the old complete output or the new complete output:
before the swap OUT is untouched; in the fallback's window between its two renames, the
next :func:`recover` (run at every compile's start, and by ``report`` and ``verify``)
finishes the swap from the complete ``OUT.new-*``. Nothing of the old output survives the
swap (no stale ``codegen/``, ``model.etrecord`` or partitions; entries a compile never
writes, such as ``OUT/gen`` from ``etforge codegen``, are the user's and are copied over),
and a failed run removes its staging directory, so it never leaves a ``model.pte`` of its
own. A non-empty OUT that is not an etforge output is refused.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from etforge.core.common.digest import sha256_file
from etforge.core.common.errors import EtforgeError

if TYPE_CHECKING:
    from etforge.core.build.session import CompileResult

PTE = "model.pte"
REPORT = "report.json"
FLOAT_PROGRAM = "float.pt2"
QUANTIZED_PROGRAM = "quantized.pt2"
#: The lowered Edge program model.pte was emitted from, for ``verify`` (``core.serialize.lowered_program``).
LOWERED_PROGRAM = "lowered_edge.exir"
ETRECORD = "model.etrecord"
PARTITIONS = "partitions"
CODEGEN = "codegen"
#: What a compile writes into OUT; anything else there means OUT is not ours to replace.
OWNED = frozenset(
    {PTE, REPORT, FLOAT_PROGRAM, QUANTIZED_PROGRAM, LOWERED_PROGRAM, ETRECORD, PARTITIONS, CODEGEN}
)
#: report.json key: relative path -> sha256 of each side file (``model.pte`` is ``pte_sha256``).
FILES_KEY = "files_sha256"

_SIBLING = re.compile(r"^(?P<name>.+)\.(?P<kind>tmp|new|old)-(?P<pid>\d+)-[A-Za-z0-9_]+$")


def _umask_mode(bits: int) -> int:
    mask = os.umask(0)
    os.umask(mask)
    return bits & ~mask


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _siblings(out: Path) -> list[tuple[str, Path]]:
    """Leftovers of runs that died (kind, path): their owner process is gone."""
    found = []
    if not out.parent.is_dir():
        return found
    for entry in sorted(out.parent.iterdir()):
        m = _SIBLING.match(entry.name)
        if m and m["name"] == out.name and not _alive(int(m["pid"])):
            found.append((m["kind"], entry))
    return found


def recover(out: Path) -> None:
    """Finish or undo what a killed run left beside ``out``.

    ``OUT.new-*`` is a complete output whose swap was cut short after OUT was moved aside:
    it becomes OUT (see :func:`_finishable`; anything else named so is removed). ``OUT.old-*`` is a previous output: restored only when OUT is missing and no
    new output exists, else removed. ``OUT.tmp-*`` is an unfinished (or, after an
    exchange, a replaced) output: removed.
    """
    out = _resolve(out)
    leftovers = _siblings(out)
    for kind, path in leftovers:
        if kind == "new":
            if _finishable(out, path, leftovers):
                os.rename(path, out)
            else:  # OUT is complete (or the leftover is not a cut-short swap): it stays
                shutil.rmtree(path, ignore_errors=True)
    for kind, path in leftovers:
        if kind == "old" and path.exists():
            if not out.exists():
                os.rename(path, out)
            else:
                shutil.rmtree(path, ignore_errors=True)
    for kind, path in leftovers:
        if kind == "tmp" and path.exists():
            shutil.rmtree(path, ignore_errors=True)


def _finishable(out: Path, new: Path, leftovers: list[tuple[str, Path]]) -> bool:
    """Whether ``new`` is what a swap cut short between its two renames left, and so may become OUT.

    :func:`commit` renames the complete staging directory to ``OUT.new-<pid>-*``, then OUT to
    ``OUT.old-<pid>-*`` (the same process), then the new one to OUT. Only when OUT is gone and
    that process's ``OUT.old-`` exists was the swap really under way; before that, OUT is still
    the complete previous output and stays. A directory merely named ``OUT.new-<dead pid>-x``
    (forged, or copied) never replaces an OUT, and must look like an output (a program and a
    report) even to take an empty place."""
    if out.exists() or out.is_symlink():
        return False
    m = _SIBLING.match(new.name)
    pid = m["pid"] if m else None
    paired = any(k == "old" and (mm := _SIBLING.match(p.name)) and mm["pid"] == pid for k, p in leftovers)
    return (
        paired
        and new.is_dir()
        and not new.is_symlink()
        and (new / PTE).is_file()
        and (new / REPORT).is_file()
    )


def _resolve(out: Path) -> Path:
    """The real location (a symlinked OUT is replaced where it points)."""
    return Path(os.path.realpath(Path(out).expanduser()))


def _sibling_name(out: Path, kind: str) -> Path:
    return out.parent / f"{out.name}.{kind}-{os.getpid()}-{os.urandom(4).hex()}"


def _foreign(out: Path) -> list[str]:
    """Entries of OUT that a compile does not write (the user's: ``out/gen`` from codegen ...)."""
    return sorted(
        e.name
        for e in out.iterdir()
        if e.name not in OWNED and not any(e.name.startswith(f".{o}.") for o in OWNED)
    )


def _carry_over(out: Path, staging: Path) -> None:
    """Copy the user's own entries of the old OUT into the new one (copies: the old stays intact)."""
    for name in _foreign(out):
        src, dst = out / name, staging / name
        if dst.exists() or dst.is_symlink():
            continue
        if src.is_dir() and not src.is_symlink():
            shutil.copytree(src, dst, symlinks=True)
        else:
            shutil.copy2(src, dst, follow_symlinks=False)


def _check_replaceable(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise EtforgeError(f"output {out} exists and is not a directory")
    if not out.is_dir():
        return
    cwd = Path.cwd().resolve()
    if cwd == out or out in cwd.parents:
        raise EtforgeError(f"output {out} contains the current directory; compile into another directory")
    foreign = _foreign(out)
    if foreign and not ((out / PTE).exists() or (out / REPORT).exists()):
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise EtforgeError(
            f"output {out} is not an etforge output ({shown}); it would be replaced whole, "
            "so compile into a new or empty directory or an earlier etforge output"
        )
    if not os.access(out, os.W_OK):
        raise EtforgeError(f"output {out} is not writable")


def prepare(out: Path) -> Path:
    """Check OUT can be replaced, clean up after killed runs, and create the staging directory.

    Runs before compiling, so an unwritable OUT (read-only mount, ``/proc``, an immutable
    directory) fails in a second with one line instead of after the whole compile.
    """
    real = _resolve(out)
    if real.exists() and not real.is_dir():
        raise EtforgeError(f"output {out} exists and is not a directory")
    parent = real.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        recover(real)
        _check_replaceable(real)
        staging = Path(tempfile.mkdtemp(dir=parent, prefix=f"{real.name}.tmp-{os.getpid()}-"))
    except OSError as exc:
        where = exc.filename or parent
        raise EtforgeError(
            f"cannot write the output {out}: {where}: {exc.strerror or type(exc).__name__}"
        ) from None
    mode = (real.stat().st_mode & 0o7777) if real.is_dir() else _umask_mode(0o777)
    os.chmod(staging, mode)  # mkdtemp makes 0700; OUT keeps its mode (or gets the usual one)
    return staging


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux ``renameat2``); False where unsupported."""
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def commit(staging: Path, out: Path) -> None:
    """Swap the complete ``staging`` in as ``out``; the old output is deleted afterwards."""
    out = _resolve(out)
    if out.is_dir():
        _carry_over(out, staging)
    if not out.exists():
        os.rename(staging, out)
        return
    if _exchange(staging, out):  # staging now holds the old output: a leftover .tmp- to remove
        shutil.rmtree(staging, ignore_errors=True)
        return
    new = staging.with_name(f"{out.name}.new-{staging.name[len(out.name) + 5 :]}")
    os.rename(staging, new)  # complete: recover() finishes the swap from here
    old = _sibling_name(out, "old")
    os.rename(out, old)
    os.rename(new, out)
    shutil.rmtree(old, ignore_errors=True)


def write_error(out: Path, exc: OSError) -> EtforgeError:
    """One line for an output that could not be written: OUT, the file, and why."""
    where = f" ({os.fsdecode(exc.filename)})" if exc.filename else ""
    return EtforgeError(f"cannot write the output {out}{where}: {exc.strerror or type(exc).__name__}")


def discard(staging: Path) -> None:
    shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def replacing(out: Path) -> Iterator[Path]:
    """``with replacing(OUT) as d:`` write into ``d``; OUT becomes ``d`` only if the block succeeds."""
    staging = prepare(out)
    try:
        yield staging
    except BaseException:
        discard(staging)
        raise
    commit(staging, out)


def write_outputs(out: Path, result: CompileResult, report: dict[str, Any], programs: bool = True) -> None:
    """Partitions, programs, report and ``model.pte`` into ``out`` (a fresh staging directory).

    ``programs=False``: a :class:`~etforge.core.serialize.program_writer.ProgramWriter` wrote them
    (and the lowered program)."""

    parts = out / PARTITIONS
    parts.mkdir(parents=True, exist_ok=True)
    for p in result.partitions:
        (parts / f"{p.name}.tflite").write_bytes(p.converted.tflite)
        if p.payload.kernel_selection is not None:  # the eIQ Neutron SDK's, for codegen to merge
            (parts / f"{p.name}_kernel_selection.c").write_bytes(p.payload.kernel_selection.encode())
    for name, program in (
        (FLOAT_PROGRAM, result.float_program),
        (QUANTIZED_PROGRAM, result.quantized_program),
    ):
        if program is not None and programs:
            from etforge.core.serialize.program_writer import save_program

            save_program(program, out / name)
    if programs:
        from etforge.core.serialize.lowered_program import save_lowered

        save_lowered(result.host_program, out / LOWERED_PROGRAM)
    record_hashes(out, report)  # the hash chain verify checks: report.json -> each side file
    (out / REPORT).write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")
    (out / PTE).write_bytes(result.pte)


def side_files(out: Path) -> list[str]:
    """The side files a compile wrote into ``out`` (relative paths, sorted)."""
    names = [n for n in (FLOAT_PROGRAM, QUANTIZED_PROGRAM, LOWERED_PROGRAM) if (out / n).is_file()]
    parts = out / PARTITIONS
    if parts.is_dir():
        names += [f"{PARTITIONS}/{p.name}" for p in sorted(parts.iterdir()) if p.is_file()]
    return sorted(names)


def record_hashes(out: Path, report: dict[str, Any]) -> None:
    """Add the side files' sha256 to ``report`` (call once they are written, before report.json):
    the hash chain ``verify`` checks (``runtime.verification.artifact``)."""
    report[FILES_KEY] = {name: sha256_file(out / name) for name in side_files(out)}


def write_etrecord(out: Path, result: CompileResult) -> None:
    """ExecuTorch devtools' ETRecord: the Edge program, the .pte and the delegates' debug maps."""
    from executorch.devtools import generate_etrecord

    program = result.quantized_program if result.quantized_program is not None else result.float_program
    generate_etrecord(str(out / ETRECORD), result.edge, result.executorch, exported_program=program)


#: Keys every reader of report.json relies on (report, verify, codegen).
REPORT_KEYS = ("model", "target", "options", "quantized", "nodes", "macs", "partitions", "memory", "inputs")


def load_report(path: Path) -> dict[str, Any]:
    """``report.json`` parsed and checked: a corrupt or foreign file is named, not a KeyError."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise EtforgeError(f"{path.parent}: no {path.name} here; run etforge compile first") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise EtforgeError(f"{path}: cannot read ({exc.__class__.__name__}: {exc})") from None
    except json.JSONDecodeError as exc:
        raise EtforgeError(
            f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); recompile"
        ) from None
    if not isinstance(data, dict):
        raise EtforgeError(f"{path}: not an etforge report (a JSON {type(data).__name__}); recompile")
    missing = [k for k in REPORT_KEYS if k not in data]
    if missing:
        raise EtforgeError(f"{path}: not an etforge report (no {', '.join(map(repr, missing))}); recompile")
    if not isinstance(data["nodes"], list) or not isinstance(data["partitions"], list):
        raise EtforgeError(
            f"{path}: not an etforge report ('nodes' and 'partitions' must be lists); recompile"
        )
    return data
