"""One dequantize per reader, so every partition boundary is int8.

PT2E's convert gives each reader of a quantized tensor its own dequantize. Decompositions
after it do not: ``unbind`` or ``split`` of a dequantized tensor (a recurrent layer's input
projection cut per time step) becomes many slices of one dequantize. Grouping puts that
dequantize in one partition, and every other partition would read its float output.
"""

from __future__ import annotations

from torch.fx import GraphModule
from torch.fx.passes.infra.pass_base import PassResult

from etforge.core.graph.utils import is_dequantize


def split_shared_dequantizes(gm: GraphModule) -> int:
    """Copy each dequantize read by several nodes, one per reader. Returns the copies made."""
    graph = gm.graph
    made = 0
    for dq in [n for n in graph.nodes if is_dequantize(n) and len(n.users) > 1]:
        readers = [u for u in dq.users if u.op != "output"]  # the signature names the output
        for user in readers if len(readers) < len(dq.users) else readers[1:]:
            with graph.inserting_after(dq):
                copy = graph.node_copy(dq)
            copy.meta = dict(dq.meta)
            user.replace_input_with(dq, copy)
            made += 1
    if made:
        gm.recompile()
    return made


def split_shared_dequantizes_pass(gm: GraphModule) -> PassResult:
    """:func:`split_shared_dequantizes` as an ExecuTorch transform pass (the classic path)."""
    return PassResult(gm, split_shared_dequantizes(gm) > 0)
