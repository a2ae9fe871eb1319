"""The delegate blob: a tagged container around what the NPU compiler produced.

Layout: ``b"ETFG"`` magic, u32 header length, UTF-8 JSON header (format tag, partition,
host_only, sizes), then the payload bytes at a 16-byte aligned offset.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

MAGIC = b"ETFG"
FORMAT_LITERT_HOST = "litert-host-v1"  # LiteRT flatbuffer, no device code (SDK absent)
_ALIGN = 16
#: The delegate's compile-spec key naming its partition (its delegation tag). ExecuTorch keeps a
#: delegate's compile specs in the ``.pte``: a device payload's only name there.
PARTITION_SPEC = "partition"


@dataclass(frozen=True)
class Blob:
    format: str
    partition: str
    host_only: bool
    data: bytes
    header: dict[str, Any]


def pack(format: str, partition: str, host_only: bool, data: bytes, **extra: Any) -> bytes:
    header = {"format": format, "partition": partition, "host_only": host_only, "size": len(data), **extra}
    raw = json.dumps(header, sort_keys=True).encode()
    head = MAGIC + struct.pack("<I", len(raw)) + raw
    pad = (-len(head)) % _ALIGN
    return head + b"\0" * pad + data


def unpack(blob: bytes) -> Blob:
    if blob[:4] != MAGIC:
        raise ValueError("not an etforge delegate payload (bad magic)")
    (n,) = struct.unpack_from("<I", blob, 4)
    header = json.loads(blob[8 : 8 + n])
    start = 8 + n + ((-(8 + n)) % _ALIGN)
    data = blob[start : start + header["size"]]
    if len(data) != header["size"]:
        raise ValueError("truncated etforge delegate payload")
    return Blob(header["format"], header["partition"], bool(header["host_only"]), data, header)


#: Device payloads the host cannot run, each answered by the LiteRT partition it was compiled
#: from (scoped by :func:`host_stand_ins`; no process-wide state).
_STAND_INS: ContextVar[dict[bytes, Blob] | None] = ContextVar("etforge_host_stand_ins", default=None)


@contextmanager
def host_stand_ins(stand_ins: dict[bytes, Blob]) -> Iterator[None]:
    """Inside the block, a host run meets a device payload (NPU microcode, which runs on the
    NPU only) as the LiteRT partition the NPU compiler compiled it from."""
    token = _STAND_INS.set({**(_STAND_INS.get() or {}), **stand_ins})
    try:
        yield
    finally:
        _STAND_INS.reset(token)


def unpack_for_host(raw: bytes) -> Blob:
    """What the host runs for a delegate payload: its stand-in when it is device code."""
    stand_in = (_STAND_INS.get() or {}).get(raw)
    return stand_in if stand_in is not None else unpack(raw)
