"""Run a LiteRT flatbuffer in the LiteRT interpreter, with a choice of kernels.

``default``: LiteRT's standard kernels (XNNPACK where it applies). Their int8 requantization
rounds the float product once, as the PT2E reference does, so a correct conversion agrees
with the quantized reference exactly and any conversion error stands out. ``reference``:
the reference kernels, whose fixed-point requantization (two roundings, as TFLite Micro
and CMSIS-NN do) is one step off on a fraction of a percent of elements; deep random-weight
nets amplify that into tens of steps at the output, a property of the kernels, not the model.
``tflm``: the reference kernels with int8 FULLY_CONNECTED computed as TFLite Micro does
(``runtime.arithmetic.tflm_arith``): what a partition run in TFLM on the device computes.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
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

    with warnings.catch_warnings(), native_stderr():  # "preserving every tensor is for debugging": it is
        warnings.simplefilter("ignore", UserWarning)
        it = Interpreter(
            model_content=model,
            experimental_op_resolver_type=resolver,
            experimental_preserve_all_tensors=preserve_all_tensors,
            num_threads=LITERT_THREADS,  # no spinning pool beside other processes
        )
        it.allocate_tensors()
    return it


_interpreter = lru_cache(maxsize=64)(interpreter)


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


def run(model: bytes, inputs: Sequence[np.ndarray], kernels: str = "default") -> list[np.ndarray]:
    """Inputs/outputs in the model's subgraph order."""
    it = _interpreter(model, kernels)
    set_inputs(it, inputs)
    it.invoke()
    return [
        np.array(it.get_tensor(d["index"])) for d in it.get_output_details()
    ]  # 0-d: an array, not a scalar
