"""A program run as exported, its parameters passed in: no ``ExportedProgram.module()``.

``module()`` unlifts a program (copies its graph, turns each parameter input into an
attribute, generates and compiles Python code: MobileNetV2, ~0.1 s a call), only for
``verify`` to call the result on each sample. The exported graph module computes the same
ops on the same tensors when given the parameters, buffers and constants as its leading
inputs (the same tensors ``module()`` holds, so a buffer changed in place carries from call to
call as there); its outputs are put back in the model's structure. A program returning a
buffer mutation or taking another kind of input gets None: the caller unlifts it as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from etforge.runtime.execution.host import program_inputs

_INPUTS = (InputKind.USER_INPUT, InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def lifted_call(ep: ExportedProgram) -> Callable[..., Any] | None:
    """A function computing ``ep.module()(*inputs)`` from the exported graph, or None."""
    sig = ep.graph_signature
    spec = ep.call_spec.out_spec
    if spec is None or any(s.kind != OutputKind.USER_OUTPUT for s in sig.output_specs):
        return None
    if any(s.kind not in _INPUTS for s in sig.input_specs):
        return None
    gm = ep.graph_module

    def run(*inputs: Any) -> Any:
        return pytree.tree_unflatten(list(gm(*program_inputs(ep, list(inputs)))), spec)

    return run
