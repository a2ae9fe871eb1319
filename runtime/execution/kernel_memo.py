"""A CPU library's host kernel call that repeats one already made returns that call's result.

``verify`` runs the Edge program on each sample, then ``model.pte``'s interpreter on the same
inputs (``pte_agreement``): the same host kernels (``pte_ops.own_functional``, CMSIS-NN's
arithmetic), so wherever the serialized program is right its kernel calls repeat the Edge run's
byte for byte. These kernels are pure: their output is a function of their arguments alone (no
state, no randomness, every input read before the output is written). So inside ``serving()``
a call whose kernel, every argument — each scalar's type and value, each tensor's dtype, sizes,
strides and the bytes of its elements, as far as the kernel reads them (``HostArithmetic.reads``:
weights read in memory order whatever their strides, scratch buffers not read) — and output
tensor's dtype, sizes and strides equal a call of the same sample's run inside ``recording()``
writes that call's output bytes into its output instead of computing them again; any other
call (one byte, one stride, one scalar different) computes. The ``.pte`` = Edge gate still sees
every byte the ``.pte`` reads and writes through its memory plan: a wrong input (an overlapped
buffer, a changed constant or argument) matches no recorded call and computes.

Recording keeps references to the Edge run's own tensors, its arguments and its output (values
of a functional program: nothing writes them afterwards; a version counter moving since is a
mismatch), so it copies nothing; serving compares bytes with ``torch.equal``. The store keeps at
most ``MAX_BYTES`` of outputs alive (past it, calls compute; counted as misses).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

#: The store's limit on the output bytes it keeps alive (the calls' arguments are mostly earlier
#: calls' outputs): a fixed constant; 32 samples of MobileNetV2-96's Cortex-M33 program keep
#: about 40 MiB. Calls past it compute as without it.
MAX_BYTES = 512 * 2**20


@dataclass
class _Call:
    fn: Callable[..., Any]
    args: list[Any]
    reads: tuple[str, ...]
    versions: list[int]  # each tensor argument's version counter, then the output's
    out: torch.Tensor  # the output as written
    layout: tuple[Any, ...]  # the output tensor's dtype, sizes, strides


@dataclass
class Store:
    """Recorded calls per run (a sample's index), in call order."""

    runs: dict[int, list[_Call]] = field(default_factory=dict)
    nbytes: int = 0
    #: ``serving()`` calls that took a recorded result / all ``serving()`` calls.
    hits: int = 0
    calls: int = 0

    def forget(self, run: int) -> None:
        """Drop run ``run``'s recorded calls and their bytes (a run cut short, recorded again)."""
        for c in self.runs.pop(run, []):
            self.nbytes -= c.out.numel() * c.out.element_size()


class _Blocks(threading.local):
    """The calling thread's ``recording()`` and ``serving()`` blocks (``verify`` records on a
    thread ahead of its sample loop while the main thread runs other interpreters)."""

    recording: tuple[Store, int] | None = None
    serving: tuple[Store, int, dict[Any, int]] | None = None


_blocks = _Blocks()


@contextlib.contextmanager
def recording(store: Store, run: int = 0) -> Iterator[Store]:
    """Host kernel calls inside the block are recorded into ``store`` as run ``run``'s."""
    saved, _blocks.recording = _blocks.recording, (store, run)
    try:
        yield store
    finally:
        _blocks.recording = saved


@contextlib.contextmanager
def serving(store: Store, run: int = 0) -> Iterator[Store]:
    """Host kernel calls inside the block equal to one of ``store``'s run ``run`` take its result."""
    saved, _blocks.serving = _blocks.serving, (store, run, {})
    try:
        yield store
    finally:
        _blocks.serving = saved


def active() -> bool:
    """Inside ``recording()`` or ``serving()`` on this thread (else a call runs as it is,
    nothing compared)."""
    return _blocks.recording is not None or _blocks.serving is not None


def _dense(t: torch.Tensor) -> bool:
    """Its elements fill ``numel`` consecutive storage slots (some order, no gap or overlap)."""
    expected = 1
    for st, sz in sorted((st, sz) for st, sz in zip(t.stride(), t.shape, strict=True) if sz != 1):
        if st != expected:
            return False
        expected *= sz
    return True


def _elements(t: torch.Tensor) -> torch.Tensor:
    """The tensor's element bytes (uint8): in memory order when dense (with equal strides, or
    for an argument read in memory order, that fixes what the kernel reads), else logical."""
    if _dense(t):
        flat = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), t.storage_offset(), (t.numel(),), (1,))
    else:
        flat = t.contiguous().reshape(-1)
    return flat.view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8)


_SAME_SIZE_INTEGER = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _as_integers(t: torch.Tensor) -> torch.Tensor:
    """A float tensor's bits as integers (``torch.equal`` on floats calls -0.0 and 0.0 equal,
    a NaN unequal to itself); any other tensor as it is."""
    if t.is_floating_point() or t.is_complex():
        return t.view(_SAME_SIZE_INTEGER.get(t.element_size(), torch.uint8))
    return t


def _plain(t: torch.Tensor) -> bool:
    return t.layout == torch.strided and not t.is_quantized and t.device.type == "cpu"


def _same(a: Any, b: Any, read: str) -> bool:
    """Would the kernel read ``a`` and ``b`` alike?"""
    if read == "unread":
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and _plain(a) and _plain(b)):
            return False
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.stride() == b.stride():  # the same layout: equal elements are equal bytes
            return torch.equal(_as_integers(a), _as_integers(b))
        if read != "bytes" or not (_dense(a) and _dense(b)):
            return False
        return torch.equal(_elements(a), _elements(b))  # read in memory order: the strides unread
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (
            isinstance(a, (list, tuple))
            and isinstance(b, (list, tuple))
            and len(a) == len(b)
            and all(_same(x, y, "whole") for x, y in zip(a, b, strict=True))
        )
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return repr(a) == repr(b)  # exact, -0.0 and NaN too
    return bool(a == b)


def _layout(out: torch.Tensor) -> tuple[Any, ...]:
    return (out.dtype, tuple(out.shape), out.stride(), _dense(out))


def _matches(c: _Call, fn: Callable[..., Any], args: Sequence[Any], out: torch.Tensor) -> bool:
    if c.fn is not fn or len(c.args) != len(args) or c.layout != _layout(out):
        return False
    tensors = [a for a in c.args if isinstance(a, torch.Tensor)] + [c.out]
    if [t._version for t in tensors] != c.versions:  # written since: not what was read and written
        return False
    return all(
        _same(a, b, c.reads[i] if i < len(c.reads) else "whole")
        for i, (a, b) in enumerate(zip(c.args, args, strict=True))
    )


def _served(fn: Callable[..., Any], args: Sequence[Any], out: torch.Tensor) -> bool:
    assert _blocks.serving is not None
    store, run, cursors = _blocks.serving
    store.calls += 1
    recorded = store.runs.get(run, [])
    start = cursors.get(fn, 0)
    # the recorded calls of this kernel from where the last match left off, then the rest
    order = [i for i in range(start, len(recorded))] + [i for i in range(start)]
    for i in order:
        c = recorded[i]
        if _matches(c, fn, args, out):
            out.copy_(c.out)
            cursors[fn] = i + 1
            store.hits += 1
            return True
    return False


def call(fn: Callable[..., Any], args: Sequence[Any], out: torch.Tensor, reads: Sequence[str] = ()) -> Any:
    """``fn(*args, out)`` — a pure host kernel writing ``out`` and returning it — recorded or
    served as the active blocks say. ``reads``: how it reads each of ``args`` (``"whole"``,
    ``"bytes"``: elements in memory order and sizes, ``"unread"``; ``HostArithmetic.reads``)."""
    if not active() or not isinstance(out, torch.Tensor):
        return fn(*args, out)
    if _blocks.serving is not None and _served(fn, args, out):
        return out
    result = fn(*args, out)
    if _blocks.recording is not None and result is out and _plain(out):
        store, run = _blocks.recording
        if store.nbytes < MAX_BYTES:
            listed = list(args)
            store.runs.setdefault(run, []).append(
                _Call(
                    fn=fn,
                    args=listed,
                    reads=tuple(reads),
                    versions=[a._version for a in [*listed, out] if isinstance(a, torch.Tensor)],
                    out=out,
                    layout=_layout(out),
                )
            )
            store.nbytes += out.numel() * out.element_size()
    return result
