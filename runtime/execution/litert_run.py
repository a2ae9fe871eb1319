"""Run a LiteRT flatbuffer in the LiteRT interpreter, with a choice of kernels.

``default``: LiteRT's standard kernels (XNNPACK where it applies). Their int8 requantization
rounds the float product once, as the PT2E reference does, so a correct conversion agrees
with the quantized reference exactly and any conversion error stands out. ``reference``:
the reference kernels, whose fixed-point requantization (two roundings, as TFLite Micro
and CMSIS-NN do) is one step off on a fraction of a percent of elements; deep random-weight
nets amplify that into tens of steps at the output, a property of the kernels, not the model.
``tflm``: the reference kernels with int8 FULLY_CONNECTED and MUL computed as TFLite Micro
does (``runtime.arithmetic.tflm_arith``): what a partition run in TFLM on the device computes.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

KERNELS = ("default", "reference", "tflm")


def interpreter(model: bytes, kernels: str, preserve_all_tensors: bool = False) -> Any:
    """A LiteRT interpreter for ``model`` with the chosen kernels, tensors allocated."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    if kernels not in KERNELS:
        raise ValueError(f"unknown LiteRT kernels {kernels!r} (known: {', '.join(KERNELS)})")
    resolver = OpResolverType.AUTO if kernels == "default" else OpResolverType.BUILTIN_REF
    if kernels == "tflm":  # the reference kernels on a rewrite computing TFLM's FULLY_CONNECTED
        from etforge.runtime.arithmetic.tflm_arith import tflm_model

        model = tflm_model(model)
    from etforge.core.common.quiet import native_stderr
    from etforge.core.common.threads import LITERT_THREADS

    # LiteRT's UserWarning that preserving every tensor is for debugging (it is, here) is one of
    # the libraries' the CLI and the API scope filter (quiet.install); no catch_warnings here:
    # it saves and restores the process's filters, and threads (verify's) would undo each other's
    with native_stderr():
        it = Interpreter(
            model_content=model,
            experimental_op_resolver_type=resolver,
            experimental_preserve_all_tensors=preserve_all_tensors,
            num_threads=LITERT_THREADS,  # no spinning pool beside other processes
        )
        it.allocate_tensors()
    return it


class _Cached(threading.local):
    """Per thread, its interpreters by (model, kernels): a LiteRT interpreter is not
    thread-safe (``verify`` runs the program on a thread ahead of its sample loop), and a
    thread's go with it when it ends."""

    def __init__(self) -> None:
        self.get = lru_cache(maxsize=64)(interpreter)


_cached = _Cached()


def _interpreter(model: bytes, kernels: str) -> Any:
    """The calling thread's own interpreter for ``model`` with ``kernels``, tensors allocated."""
    return _cached.get(model, kernels)


def set_inputs(it: Any, inputs: Sequence[np.ndarray]) -> None:
    """Inputs in the model's subgraph order; raises with the tensor name on a mismatch."""
    details = it.get_input_details()
    if len(details) != len(inputs):
        raise ValueError(f"LiteRT model takes {len(details)} inputs, got {len(inputs)}")
    for d, x in zip(details, inputs, strict=True):
        arr = np.asarray(x, order="C")  # (ascontiguousarray turns a 0-d array into [1])
        if tuple(arr.shape) != tuple(d["shape"]) or arr.dtype != d["dtype"]:
            raise ValueError(
                f"LiteRT input {d['name']!r}: expected {d['dtype'].__name__}{list(d['shape'])}, got {arr.dtype}{list(arr.shape)}"
            )
        it.set_tensor(d["index"], arr)


class _Keeping(threading.local):
    """Per thread, while ``keeping()`` is active: per (model, kernels), an interpreter that keeps
    every tensor and the inputs of its last run (``kept`` reads that run's tensors back without
    running again), and the kernels it keeps them for."""

    store: dict[tuple[bytes, str], tuple[Any, list[np.ndarray]]] | None = None
    kernels = ""


_keeping = _Keeping()


@contextlib.contextmanager
def keeping(kernels: str, store: dict[Any, Any] | None = None) -> Iterator[None]:
    """Runs with ``kernels`` inside the block keep every tensor of their last run per model
    (verify reads the int8 values of the reference run it already did instead of running the
    partition again). Other kernels run as usual: keeping every tensor can change which
    delegate LiteRT applies, never what the reference kernels compute. ``store``: where the
    interpreters live, so that several blocks (and samples) share them. The block holds for
    the calling thread only (another thread's runs are its own)."""
    saved = (_keeping.store, _keeping.kernels)
    _keeping.store, _keeping.kernels = (store if store is not None else {}), kernels
    try:
        yield
    finally:
        _keeping.store, _keeping.kernels = saved


def kept(model: bytes, kernels: str, inputs: Sequence[np.ndarray]) -> Any | None:
    """The interpreter whose last run (inside ``keeping()``) was ``model`` with ``kernels`` on
    exactly ``inputs``, every tensor still held; None otherwise."""
    entry = (_keeping.store or {}).get((model, kernels))
    if entry is None or len(entry[1]) != len(inputs):
        return None
    it, last = entry
    same = all(np.array_equal(a, np.asarray(b)) for a, b in zip(last, inputs, strict=True))
    return it if same else None


def run(model: bytes, inputs: Sequence[np.ndarray], kernels: str = "default") -> list[np.ndarray]:
    """Inputs/outputs in the model's subgraph order."""
    if kernels == "tflm":  # int8 MUL as TFLM computes it (_run_tflm)
        outs = _run_tflm(model, inputs)
        if outs is not None:
            return outs
    keep = _keeping.store
    if keep is not None and kernels == _keeping.kernels:
        it = (keep.get((model, kernels)) or (None,))[0] or interpreter(model, kernels, True)
        keep[(model, kernels)] = (it, [np.array(x, copy=True) for x in inputs])
    else:
        it = _interpreter(model, kernels)
    set_inputs(it, inputs)
    it.invoke()
    return [
        np.array(it.get_tensor(d["index"])) for d in it.get_output_details()
    ]  # 0-d: an array, not a scalar


def _run_tflm(model: bytes, inputs: Any) -> list[np.ndarray] | None:
    """What TFLM computes for ``model`` on ``inputs`` (subgraph order), or None when ``model``
    has no int8 MUL (then LiteRT's reference kernels on ``tflm_model`` compute it whole)."""
    from etforge.runtime.arithmetic.tflm_arith import _Mul, _steps, tflm_model

    cut = _steps(tflm_model(model))
    if cut is None:
        return None
    steps, graph_inputs, graph_outputs = cut
    env = {t: np.asarray(x) for t, x in zip(graph_inputs, inputs, strict=True)}
    for step in steps:
        if isinstance(step, _Mul):
            known = {**env, **dict(step.constants)}
            env[step.out] = step(known[step.a], known[step.b])
            continue
        piece, ins, outs = step
        it = _interpreter(piece, "reference")
        set_inputs(it, [env[i] for i in ins])
        it.invoke()
        details = it.get_output_details()
        for t, d in zip(outs, details, strict=True):
            env[t] = np.array(it.get_tensor(d["index"]))
    return [env[t] for t in graph_outputs]
