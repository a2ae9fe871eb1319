"""The dtype/device assertions ``torch.export`` leaves in a static graph, removed.

A no-op cast (``x.to(x.dtype)``, ``x.float()`` on a float32 tensor: Hugging Face's norms
cast to float and back) exports as ``aten._assert_tensor_metadata`` on its input. Export
has already checked it: every value's dtype and device are fixed in the graph it traced. Left
in, it is a CPU node reading an NPU tensor, and each one cut a partition in two (HF
ConvNeXt: 8 assertions, 13 partitions). Removing it changes no value.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from etforge.core.graph.utils import clone_program


def drop_metadata_asserts(ep: ExportedProgram, owned: bool = True) -> tuple[ExportedProgram, list[str]]:
    """``ep`` without ``_assert_tensor_metadata`` nodes, and a note when there were any.

    ``owned``: ``ep`` is the compile's own (edited in place); else a copy is edited."""
    target = torch.ops.aten._assert_tensor_metadata.default
    if not ep.graph_module.graph.find_nodes(op="call_function", target=target):
        return ep, []
    if not owned:
        ep = clone_program(ep)
    graph = ep.graph_module.graph
    found = list(graph.find_nodes(op="call_function", target=target))
    for node in found:
        graph.erase_node(node)
    ep.graph_module.recompile()
    return ep, [
        f"removed {len(found)} dtype/device assertion(s) torch.export left after no-op casts "
        "(aten._assert_tensor_metadata: statically true in the exported graph)"
    ]
