"""Node provenance records shared, not deep-copied, during a compile.

Why: every node a pass creates gets a ``torch.fx.traceback.NodeSource`` naming the node it came
from, and ``NodeSource.__init__`` deep-copies that node's whole provenance chain into it.
Chains grow by one link per re-trace, so the copies grow with every pass: on a torchvision
model about a tenth of the compile's wall time went into copying them.

A ``NodeSource`` is never changed once built (torch builds a new one for every new fact; the
lists that grow are the nodes' own ``meta["from_node"]`` lists, which are still copied), so
inside :func:`shared_provenance` a deep copy of one returns the record itself: every chain
holds the same records with the same fields, only not duplicated in memory. Outside, torch's
behaviour is back. ``tests/test_deferred_code.py`` compares a compile's bytes both ways.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from torch.fx.traceback import NodeSource

#: Off: ``shared_provenance()`` changes nothing (the tests compare compiles both ways).
ENABLED = True

_lock = threading.Lock()
_depth = 0


def _shared(self: NodeSource, memo: dict[int, Any]) -> NodeSource:
    return self


@contextlib.contextmanager
def shared_provenance() -> Iterator[None]:
    """Deep copies of ``NodeSource`` records return the record while inside (re-entrant,
    thread-safe: torch's deep copy comes back when the last scope in the process ends)."""
    global _depth
    with _lock:
        # Off, or a torch that defines its own copy of these records: leave it alone.
        active = ENABLED and (_depth > 0 or "__deepcopy__" not in vars(NodeSource))
        if active:
            if _depth == 0:
                NodeSource.__deepcopy__ = _shared  # type: ignore[attr-defined]
            _depth += 1
    if not active:
        yield
        return
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                del NodeSource.__deepcopy__  # type: ignore[attr-defined]
