"""A copy of a quantized program whose nodes that read no input are computed once.

``verify`` runs the quantized program in float32 on every sample (torch's reference), and
every run dequantizes every weight again (MobileNetV2: 104 per-channel dequantizes, about
half the run). The nodes ``ConstantNodes`` finds (pure, every input a constant) compute the
same tensor on every run; here each such node that a sample-dependent node reads is computed
once and stored in a copy of the module as a buffer read in its place. The ops run are the
same on the same tensors, so the values are the same.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch.fx import Node

from etforge.runtime.verification.constant_nodes import ConstantNodes


def folded(module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``module`` with its constant nodes computed (``module`` itself is not changed)."""
    constants = ConstantNodes(module.graph)
    calls = [n for n in module.graph.nodes if n in constants.nodes and n.op == "call_function"]
    if not calls:
        return module
    gm = copy.deepcopy(module)
    nodes = {n.name: n for n in gm.graph.nodes}
    interp = torch.fx.Interpreter(gm)
    values: dict[Node, Any] = {}
    kept = {nodes[n.name] for n in constants.nodes}
    with torch.no_grad():
        for n in gm.graph.nodes:
            if n not in kept:
                continue
            if n.op == "get_attr":
                values[n] = interp.fetch_attr(n.target)
                continue
            args = torch.fx.node.map_arg(n.args, values.__getitem__)
            kwargs = torch.fx.node.map_arg(n.kwargs, values.__getitem__)
            values[n] = n.target(*args, **kwargs)
    count = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or n not in kept or not isinstance(values[n], torch.Tensor):
            continue
        if all(u in kept for u in n.users):
            continue  # read only by other constants: folded with them
        name = f"_etforge_folded_{count}"
        count += 1
        gm.register_buffer(name, values[n])
        with gm.graph.inserting_before(n):
            attr = gm.graph.get_attr(name)
        n.replace_all_uses_with(attr)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm
