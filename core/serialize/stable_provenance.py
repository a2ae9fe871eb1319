"""torch's node provenance written with graph numbers instead of memory addresses.

Each node's ``from_node`` records (``torch.fx.traceback.NodeSource``) name the graph a source
node lived in by ``id(graph)``: a memory address, different in every process. Written as is,
two compiles of one model give ``quantized.pt2`` files (and so ``report.json``, which hashes
them) that differ in those numbers alone. :func:`numbered_graphs` renumbers them for the length
of a save: each distinct address becomes its order of first appearance (0, 1, ...) in a walk of
the program's nodes in graph order, so records of one graph keep one number and records of two
graphs keep two. The addresses are put back afterwards: the records may be shared with
programs the compile still holds (``core.graph.shared_provenance``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from torch.export import ExportedProgram


def _sources(program: ExportedProgram) -> list[Any]:
    """Every provenance record of ``program``, each once, in a fixed order (graph order, then
    depth first through each record's own sources)."""
    seen: set[int] = set()
    order: list[Any] = []
    stack: list[Any] = []
    for module in program.graph_module.modules():
        graph = getattr(module, "graph", None)
        if graph is None:
            continue
        for node in graph.nodes:
            stack.extend(reversed(node.meta.get("from_node") or ()))
            while stack:
                source = stack.pop()
                if id(source) in seen:
                    continue
                seen.add(id(source))
                order.append(source)
                stack.extend(reversed(getattr(source, "from_node", None) or ()))
    return order


def _forget_cached(sources: list[Any]) -> None:
    # to_dict() caches each record's dict, its sources' dicts nested inside: all are rebuilt.
    for source in sources:
        if hasattr(source, "_dict"):
            source._dict = None


@contextlib.contextmanager
def numbered_graphs(program: ExportedProgram) -> Iterator[None]:
    """Inside the block, ``program``'s provenance names graphs by number, not address."""
    sources = _sources(program)
    numbers: dict[int, int] = {}
    original: list[tuple[Any, int]] = []
    for source in sources:
        info = getattr(source, "node_info", None)
        if info is None or not isinstance(getattr(info, "graph_id", None), int):
            continue
        original.append((info, info.graph_id))
        info.graph_id = numbers.setdefault(info.graph_id, len(numbers))
    _forget_cached(sources)
    try:
        yield
    finally:
        for info, graph_id in original:
            info.graph_id = graph_id
        _forget_cached(sources)
