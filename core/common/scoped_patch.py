"""A change to a library class held while any compile in the process is inside a scope.

Why one piece: ``core/graph/deferred_code.py`` and ``core/graph/shared_provenance.py`` each
swap one attribute of a torch class for the length of a compile. Compiles may run on several
threads at once (the batch runner), so the change is counted: applied when the first scope
enters, undone when the last one leaves, under one lock.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator


class ScopedPatch:
    """``apply()`` on the first :meth:`scope` entered, ``undo()`` when the last one leaves."""

    def __init__(self, apply: Callable[[], None], undo: Callable[[], None]) -> None:
        self._apply, self._undo = apply, undo
        self._lock = threading.Lock()
        self._depth = 0

    @contextlib.contextmanager
    def scope(self) -> Iterator[None]:
        with self._lock:
            if self._depth == 0:
                self._apply()
            self._depth += 1
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    self._undo()
