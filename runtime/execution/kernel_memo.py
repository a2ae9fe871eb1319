"""A CPU library's host kernel call that repeats one already made returns that call's result.

``verify`` runs the Edge program on each sample, then ``model.pte``'s interpreter on the same
inputs (``pte_agreement``): the same host kernels (``pte_ops.own_functional``, CMSIS-NN's
arithmetic), so wherever the serialized program is right its kernel calls repeat the Edge run's
byte for byte. These kernels are pure: their output is a function of their arguments alone (no
state, no randomness, every input read before the output is written). So inside ``serving()``
a call whose kernel, every argument — each scalar's type and value, each tensor's dtype, sizes,
strides and the bytes of its elements, as far as the kernel reads them (``HostArithmetic.reads``:
weights read in memory order whatever their strides, scratch buffers not read) — and output
tensor's dtype, sizes and strides equal a
call made inside ``recording()`` writes that call's output bytes into its output instead of
computing them again; any other call (one byte, one stride, one scalar different) computes.
The ``.pte`` = Edge gate still sees every byte the ``.pte`` reads and writes through its
memory plan: a wrong input (an overlapped buffer, a changed constant or argument) is a
different key and computes.

The key is a SHA-256 digest of all of that (collisions: about 2^-128); the store holds at
most ``MAX_BYTES`` of outputs (past it, calls compute; counted as misses).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

#: The store's limit on recorded output bytes (a fixed constant: 32 samples of MobileNetV2-96's
#: Cortex-M33 program record about 40 MiB); calls past it compute as without the store.
MAX_BYTES = 512 * 2**20


@dataclass
class Store:
    """Recorded calls: (kernel, digest) -> the output as written (its strides kept)."""

    results: dict[tuple[Callable[..., Any], bytes], torch.Tensor] = field(default_factory=dict)
    nbytes: int = 0
    #: ``serving()`` calls that took a recorded result / all ``serving()`` calls.
    hits: int = 0
    calls: int = 0


_recording: Store | None = None
_serving: Store | None = None


@contextlib.contextmanager
def recording(store: Store) -> Iterator[Store]:
    """Host kernel calls inside the block are recorded into ``store``."""
    global _recording
    saved, _recording = _recording, store
    try:
        yield store
    finally:
        _recording = saved


@contextlib.contextmanager
def serving(store: Store) -> Iterator[Store]:
    """Host kernel calls inside the block equal to one of ``store``'s take its result."""
    global _serving
    saved, _serving = _serving, store
    try:
        yield store
    finally:
        _serving = saved


def _dense(t: torch.Tensor) -> bool:
    """Its elements fill ``numel`` consecutive storage slots (some order, no gap or overlap)."""
    expected = 1
    for st, sz in sorted((st, sz) for st, sz in zip(t.stride(), t.shape, strict=True) if sz != 1):
        if st != expected:
            return False
        expected *= sz
    return True


def _elements(t: torch.Tensor) -> memoryview:
    """The tensor's element bytes: in memory order when dense (with its strides in the key,
    that fixes every element), else in logical order."""
    if _dense(t):
        flat = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), t.storage_offset(), (t.numel(),), (1,))
    else:
        flat = t.contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if t.numel() else memoryview(b"")


class _Unkeyable(Exception):
    """An argument of a kind the key does not cover: the call computes."""


def _describe(value: Any, read: str, parts: list[str], data: list[memoryview]) -> None:
    """``value`` as the kernel reads it (``read``: ``HostArithmetic.reads``), as header text
    in ``parts`` and element bytes in ``data`` (their lengths follow from the header)."""
    if read == "unread":
        parts.append("U")
    elif isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_quantized or value.device.type != "cpu":
            raise _Unkeyable
        dense = _dense(value)
        if read == "bytes" and dense:  # memory order and sizes: the strides are not read
            parts.append(f"B{value.dtype}{tuple(value.shape)}")
        else:
            parts.append(f"T{value.dtype}{tuple(value.shape)}{value.stride()}{dense}")
        data.append(_elements(value))
    elif isinstance(value, (list, tuple)):
        parts.append(f"L{len(value)}")
        for v in value:
            _describe(v, "whole", parts, data)
    elif value is None or isinstance(value, (bool, int, float, str)):
        parts.append(f"{type(value).__name__}:{value!r}")  # repr: exact for a float, -0.0 too
    elif isinstance(value, (torch.dtype, torch.memory_format, torch.layout)):
        parts.append(f"E{value}")
    else:
        raise _Unkeyable


def _key(
    fn: Callable[..., Any], args: Sequence[Any], out: torch.Tensor, reads: Sequence[str]
) -> tuple[Any, bytes] | None:
    parts: list[str] = [f"A{len(args)}"]
    data: list[memoryview] = []
    try:
        for i, value in enumerate(args):
            _describe(value, reads[i] if i < len(reads) else "whole", parts, data)
    except _Unkeyable:
        return None
    parts.append(f"O{out.dtype}{tuple(out.shape)}{out.stride()}{_dense(out)}")
    h = hashlib.sha256("\x1f".join(parts).encode())
    for d in data:
        h.update(d)
    return fn, h.digest()


def call(fn: Callable[..., Any], args: Sequence[Any], out: torch.Tensor, reads: Sequence[str] = ()) -> Any:
    """``fn(*args, out)`` — a pure host kernel writing ``out`` and returning it — recorded or
    served as the active blocks say. ``reads``: how it reads each of ``args`` (``"whole"``,
    ``"bytes"``: elements in memory order and sizes, ``"unread"``; ``HostArithmetic.reads``)."""
    if (_recording is None and _serving is None) or not isinstance(out, torch.Tensor):
        return fn(*args, out)
    key = _key(fn, args, out, reads)
    if _serving is not None:
        _serving.calls += 1
        found = _serving.results.get(key) if key is not None else None
        if found is not None:
            _serving.hits += 1
            return out.copy_(found)
    result = fn(*args, out)
    store = _recording
    if store is not None and key is not None and result is out and store.nbytes < MAX_BYTES:
        if key not in store.results:
            store.results[key] = out.clone()  # clone keeps a dense tensor's strides
            store.nbytes += out.numel() * out.element_size()
    return result
