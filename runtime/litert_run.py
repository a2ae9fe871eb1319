"""Run a LiteRT flatbuffer with the reference kernels (closest to the microcontroller's)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import numpy as np


@lru_cache(maxsize=64)
def _interpreter(model: bytes) -> object:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    it = Interpreter(model_content=model, experimental_op_resolver_type=OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    return it


def run(model: bytes, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Inputs/outputs in the model's subgraph order; raises with the tensor name on a mismatch."""
    it = _interpreter(model)
    details = it.get_input_details()  # type: ignore[attr-defined]
    if len(details) != len(inputs):
        raise ValueError(f"LiteRT model takes {len(details)} inputs, got {len(inputs)}")
    for d, x in zip(details, inputs, strict=True):
        arr = np.ascontiguousarray(x)
        if tuple(arr.shape) != tuple(d["shape"]) or arr.dtype != d["dtype"]:
            raise ValueError(
                f"LiteRT input {d['name']!r}: expected {d['dtype'].__name__}{list(d['shape'])}, got {arr.dtype}{list(arr.shape)}"
            )
        it.set_tensor(d["index"], arr)  # type: ignore[attr-defined]
    it.invoke()  # type: ignore[attr-defined]
    return [it.get_tensor(d["index"]).copy() for d in it.get_output_details()]  # type: ignore[attr-defined]
