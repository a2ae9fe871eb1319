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
from collections.abc import Iterator
from typing import Any

from torch.fx.traceback import NodeSource

from etforge.core.common.scoped_patch import ScopedPatch

#: Off: ``shared_provenance()`` changes nothing (the tests compare compiles both ways).
ENABLED = True

#: A torch whose records copy themselves their own way is left alone.
_TORCH_COPIES_ITSELF = "__deepcopy__" in vars(NodeSource)


def _shared(self: NodeSource, memo: dict[int, Any]) -> NodeSource:
    return self


def _share() -> None:
    NodeSource.__deepcopy__ = _shared  # type: ignore[attr-defined]


def _copy() -> None:
    del NodeSource.__deepcopy__  # type: ignore[attr-defined]


_PATCH = ScopedPatch(_share, _copy)


@contextlib.contextmanager
def shared_provenance() -> Iterator[None]:
    """Deep copies of ``NodeSource`` records return the record while inside (re-entrant,
    thread-safe: torch's deep copy comes back when the last scope in the process ends)."""
    if not ENABLED or _TORCH_COPIES_ITSELF:
        yield
        return
    with _PATCH.scope():
        yield
