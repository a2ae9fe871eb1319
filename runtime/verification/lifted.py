"""A program run as exported, its parameters passed in: no ``ExportedProgram.module()``; and
the same unlifted module ``module()`` builds, built once.

``module()`` unlifts a program (copies its graph, turns each parameter input into an
attribute, generates and compiles Python code: MobileNetV2, ~0.1 s a call), only for
``verify`` to call the result on each sample. The exported graph module computes the same
ops on the same tensors when given the parameters, buffers and constants as its leading
inputs (the same tensors ``module()`` holds, so a buffer changed in place carries from call to
call as there); its outputs are put back in the model's structure. A program returning a
buffer mutation or taking another kind of input gets None: the caller unlifts it as before.

``unlifted`` builds the graph ``module(check_guards=False)`` builds (each parameter, buffer
and constant placeholder a ``get_attr`` of the same name, the pytree code generator of the
same specs) with one code generation instead of ``module()``'s four (MobileNetV2-96's
quantized program: 0.10 -> 0.05 s). It leaves out only what no interpreter reads: the
input-constraint hook, train/eval hooks and ``from_node`` provenance. Effect tokens and
mutations get None: ``module()`` as before.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from etforge.runtime.execution.host import program_inputs

_INPUTS = (InputKind.USER_INPUT, InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def _plain(ep: ExportedProgram) -> bool:
    """Only user outputs (no buffer mutation, no token) and inputs the graph reads as values."""
    sig = ep.graph_signature
    return all(s.kind == OutputKind.USER_OUTPUT for s in sig.output_specs) and all(
        s.kind in _INPUTS for s in sig.input_specs
    )


def lifted_call(ep: ExportedProgram) -> Callable[..., Any] | None:
    """A function computing ``ep.module()(*inputs)`` from the exported graph, or None."""
    spec = ep.call_spec.out_spec
    if spec is None or not _plain(ep):
        return None
    gm = ep.graph_module

    def run(*inputs: Any) -> Any:
        return pytree.tree_unflatten(list(gm(*program_inputs(ep, list(inputs)))), spec)

    return run


def unlifted(ep: ExportedProgram) -> torch.fx.GraphModule | None:
    """``ep.module(check_guards=False)``'s graph and attributes in a GraphModule, or None
    where ``module()`` does more than unlift (effect tokens, mutations: the caller calls it)."""
    try:  # module()'s own helpers (torch private): without them, module() itself
        from torch.export._unlift import _get_codegen, _register_attrs_to_new_gm
    except ImportError:
        return None
    sig = ep.graph_signature
    in_spec = ep.call_spec.in_spec
    if in_spec is None or not _plain(ep):
        return None
    graph = copy.deepcopy(ep.graph)  # module() copies the graph the same way: the same names
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(sig.input_specs):
        return None
    for node, spec in zip(placeholders, sig.input_specs, strict=True):
        if spec.kind == InputKind.USER_INPUT:
            continue
        with graph.inserting_after(node):  # as module(): the attribute read where the input was
            attr = graph.get_attr(str(spec.target))
        node.replace_all_uses_with(attr)
        attr.meta = node.meta
        graph.erase_node(node)
    call = ep.module_call_graph[0].signature if ep.module_call_graph else None
    graph._codegen = _get_codegen(in_spec, ep.call_spec.out_spec, call.forward_arg_names if call else None)
    root = torch.nn.Module()
    _register_attrs_to_new_gm(root, sig, ep.state_dict, ep.constants)
    gm = torch.fx.GraphModule(root, graph)  # one code generation
    gm.meta.update(ep.graph_module.meta)
    return gm
