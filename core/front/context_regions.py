"""``torch.autocast`` and grad-mode blocks inside a model, inlined into its graph.

``torch.export`` keeps a ``with torch.autocast(...)`` or ``with torch.no_grad()`` block of a
model's ``forward`` as a higher-order op over a submodule (``wrap_with_autocast``,
``wrap_with_set_grad_enabled``); no later stage lowers such an op (efficientvit's attention
runs under ``autocast(enabled=False)``: "unexpected KeyError: 'val'" in the lowering). For
float32 inference neither changes a value: grad mode never does, and an autocast that is
disabled, or for another device type than the CPU's, does not apply to the program's CPU
tensors. So the block's ops take the op's place in the graph. An enabled CPU autocast would
compute in bfloat16 or float16: refused, naming the node.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node

from etforge.core.common.errors import EtforgeError
from etforge.core.graph.utils import clone_program, sync_output_specs

#: The higher-order ops that only set a context, and the position of their submodule argument.
SUBMODULE_ARG = {"wrap_with_autocast": 4, "wrap_with_set_grad_enabled": 1}


def _region(node: Node) -> str | None:
    name = getattr(node.target, "_name", None)
    is_hop = isinstance(node.target, torch._ops.HigherOrderOperator)
    return name if node.op == "call_function" and is_hop and name in SUBMODULE_ARG else None


def _check(node: Node) -> None:
    """Refuse an autocast that would change the program's arithmetic."""
    if _region(node) != "wrap_with_autocast":
        return
    device_type, dtype, enabled = node.args[0], node.args[1], node.args[2]
    if enabled and device_type == "cpu":
        raise EtforgeError(
            f"node {node.name} ({_region(node)}): the model runs a block under "
            f"torch.autocast('cpu', dtype={dtype}), "
            "which computes in reduced precision; etforge compiles float32 models: remove the "
            "autocast block (or disable it) for export"
        )


def inline_context_regions(ep: ExportedProgram, owned: bool = True) -> tuple[ExportedProgram, list[str]]:
    """``ep`` with every autocast / grad-mode block's ops in its own graph, and a note for the
    user when there was one. ``owned``: ``ep`` is the compile's own (edited in place); else a
    copy is edited."""
    if not any(_region(n) for n in ep.graph_module.graph.nodes):
        return ep, []
    if not owned:
        ep = clone_program(ep)
    gm = ep.graph_module
    count = 0
    while regions := [n for n in gm.graph.nodes if _region(n)]:  # nested blocks surface in turn
        for node in regions:
            _check(node)
            _inline(gm, node)
            count += 1
    sync_output_specs(ep)
    gm.graph.lint()
    gm.recompile()
    return ep, [
        f"{count} autocast / grad-mode block(s) in the model's forward were inlined: neither changes "
        "a float32 value on the CPU"
    ]


def _inline(gm: GraphModule, node: Node) -> None:
    index = SUBMODULE_ARG[str(_region(node))]
    holder = node.args[index]
    assert isinstance(holder, Node) and holder.op == "get_attr"
    sub = getattr(gm, str(holder.target))
    operands = node.args[index + 1 :]
    env: dict[Node, Any] = {}
    placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(operands):
        raise EtforgeError(
            f"node {node.name}: its block takes {len(placeholders)} inputs, given {len(operands)}"
        )
    env.update(zip(placeholders, operands, strict=True))
    results: Any = None
    with gm.graph.inserting_before(node):
        for inner in sub.graph.nodes:
            if inner.op == "placeholder":
                continue
            if inner.op == "output":
                results = torch.fx.map_arg(inner.args[0], env.__getitem__)
                continue
            if inner.op == "get_attr":  # a nested block's submodule, a constant
                name = _free_name(gm, str(inner.target))
                setattr(gm, name, getattr(sub, str(inner.target)))
                new = gm.graph.get_attr(name)
                new.meta = dict(inner.meta)
            else:
                new = gm.graph.node_copy(inner, env.__getitem__)
            env[inner] = new
    flat = results if isinstance(results, (list, tuple)) else (results,)
    for user in list(node.users):
        if user.op != "call_function" or user.target is not operator.getitem:
            raise EtforgeError(f"node {node.name}: its result is used whole by {user.name}")
        user.replace_all_uses_with(flat[user.args[1]])
        gm.graph.erase_node(user)
    gm.graph.erase_node(node)
    if not holder.users:
        gm.graph.erase_node(holder)
        if not any(n.op == "get_attr" and n.target == holder.target for n in gm.graph.nodes):
            delattr(gm, str(holder.target))


def _free_name(gm: GraphModule, base: str) -> str:
    base = base.replace(".", "_")
    name, i = base, 0
    while hasattr(gm, name):
        i += 1
        name = f"{base}_{i}"
    return name
