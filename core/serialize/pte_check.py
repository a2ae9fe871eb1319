"""Is this ``model.pte`` whole, an ExecuTorch program, and the one ``report.json`` describes?

``verify`` and ``codegen`` both refuse a file that fails here, before reading it further: an
empty or truncated file, one without the ExecuTorch file identifier, or one whose SHA-256 is
not the ``pte_sha256`` the compile recorded (tampered bytes, another model's program).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from etforge.core.common.errors import EtforgeError

#: Bytes 4..8 of every ExecuTorch program (the flatbuffer file identifier "ET" + version).
_IDENT = b"ET"
#: The smallest flatbuffer a program could be: root offset + file identifier.
_MIN_BYTES = 8


def check_pte(path: Path, report: dict[str, Any] | None = None) -> bytes:
    """The file's bytes, or an ``EtforgeError`` naming ``path`` and what is wrong with it.

    With ``report`` (the compile's ``report.json``), the bytes must hash to its ``pte_sha256``.
    """
    if not path.is_file():
        raise EtforgeError(f"{path} does not exist")
    data = path.read_bytes()
    if not data:
        raise EtforgeError(f"{path} is empty: the compile did not finish writing it; recompile")
    if len(data) < _MIN_BYTES or data[4:6] != _IDENT:
        raise EtforgeError(f"{path} is not an ExecuTorch program (no 'ET' file identifier)")
    _check_extended_header(path, data)
    expected = (report or {}).get("pte_sha256")
    if report is not None and expected is None:
        raise EtforgeError(f"{path}: its report.json records no pte_sha256; recompile")
    if expected is not None:
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected:
            raise EtforgeError(
                f"{path} is not the program its report.json describes (sha256 {actual[:12]}… != "
                f"{str(expected)[:12]}…): modified, truncated or from another compile; recompile"
            )
    return data


def _check_extended_header(path: Path, data: bytes) -> None:
    """The extended header (when present) names the program and segment sizes: all must fit."""
    from etforge.core.serialize.pte_read import extended_header

    header = extended_header(data)
    if header is None:
        return
    end = max(header.program_size, header.segment_base_offset + header.segment_data_size)
    if end > len(data):
        raise EtforgeError(
            f"{path} is truncated or corrupt: its header declares {end:,} bytes, the file has {len(data):,}"
        )


def load_program(path: Path, data: bytes) -> Any:
    """ExecuTorch's own deserialization of ``data`` (an ``executorch.exir.schema.Program``)."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    try:
        return deserialize_pte_binary(data).program
    except Exception as exc:  # flatc and the segment reader raise many kinds
        raise EtforgeError(
            f"{path}: cannot read the program (truncated or corrupt?): {type(exc).__name__}: {exc}"
        ) from None
