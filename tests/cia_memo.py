"""Skip torch's re-materialization of every composite op when no registration changed.

``run_decompositions`` (three per program in ExecuTorch's ``to_edge_transform_and_lower``)
collects the CompositeImplicitAutograd ops of every ``torch.ops`` namespace, and for each
namespace first materializes *all* such ops of the C++ dispatcher
(``torch._export.utils._materialize_cpp_cia_ops``): about 40 full passes per collection, the
same getattrs each time. Torch cannot cache it because a registration may appear at any time;
this memo keys it on the dispatcher's list of those registrations, so a new one materializes
again. The collection it feeds (and so every decomposition) is unchanged; only the repeated
getattrs go (issue 47: 47 ms -> 16 ms per collection, measured beside ExecuTorch's NXP
backend). Used where one process lowers many programs: the differential test's two sides.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch._export.utils as export_utils

_KEY = "CompositeImplicitAutograd"


def _memoized(materialize: Callable[[], None]) -> Callable[[], None]:
    done: list[list[str] | None] = [None]

    def materialize_once() -> None:
        registered = torch._C._dispatch_get_registrations_for_dispatch_key(_KEY)
        if registered != done[0]:
            materialize()
            done[0] = registered

    return materialize_once


@contextmanager
def memoized() -> Iterator[None]:
    """The memo installed for the block, torch's own function restored after it."""
    original = export_utils._materialize_cpp_cia_ops
    export_utils._materialize_cpp_cia_ops = _memoized(original)
    try:
        yield
    finally:
        export_utils._materialize_cpp_cia_ops = original


def install() -> None:
    """The memo for the rest of the process (a child that lowers many programs)."""
    export_utils._materialize_cpp_cia_ops = _memoized(export_utils._materialize_cpp_cia_ops)
