"""Values of a program's nodes that read no input: computed on the first sample, reused on the others.

``verify`` runs the quantized program through its own interpreters once per sample (the device
simulation, the float64 reference), and every run dequantizes every weight again (MobileNetV2:
104 per-channel dequantizes a sample) although none of them depends on the sample. A node
whose inputs are all constants computes the same tensor on every run; here it is computed on
the first and handed out on the rest. Only pure nodes are kept: a graph with any in-place op
keeps nothing (an in-place op could change a kept tensor between two readers), and nothing
random or impure is a constant.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import Graph, Node


def _pure(n: Node) -> bool:
    schema = getattr(n.target, "_schema", None)
    if schema is None:
        return False  # a Python callable: its effects are unknown
    if schema.is_mutable or n.is_impure():
        return False
    return torch.Tag.nondeterministic_seeded not in getattr(n.target, "tags", ())


class ConstantNodes:
    """The constant nodes of one graph and, once computed, their values."""

    def __init__(self, graph: Graph) -> None:
        self.nodes: set[Node] = set()
        self.values: dict[Node, Any] = {}
        #: What a reader derives from a kept value (``exact_sums``: a weight's integer codes).
        self.derived: dict[Node, Any] = {}
        calls = [n for n in graph.nodes if n.op == "call_function"]
        if any(getattr(getattr(n.target, "_schema", None), "is_mutable", False) for n in calls):
            return  # an in-place op anywhere: keep nothing
        for n in graph.nodes:
            if n.op == "get_attr":
                self.nodes.add(n)
            elif n.op == "call_function" and n.all_input_nodes and _pure(n):
                if all(a in self.nodes for a in n.all_input_nodes):
                    self.nodes.add(n)

    def get(self, n: Node) -> tuple[bool, Any]:
        """(True, the kept value) for a constant node computed before; (False, None) otherwise."""
        if n in self.values:
            return True, self.values[n]
        return False, None

    def keep(self, n: Node, value: Any) -> None:
        if n in self.nodes and n.op == "call_function" and isinstance(value, torch.Tensor):
            self.values[n] = value
