"""Work ``verify`` runs on a thread ahead of its sample loop: the compiled program's runs.

Each sample's runs of the compiled program (its NPU partitions in LiteRT with the reference
kernels and with the user's, its CPU ops' host kernels) depend only on the sample's inputs and
the program; the sample loop then judges them (the per-op gates, the device simulation), which
is Python work that holds the interpreter lock. LiteRT's ``Invoke`` and torch's kernels run
without it, so computed on a thread up to a chunk of samples ahead, the runs take the second
core while the main thread judges the samples before them. The same values: the same code on
the same inputs, each thread with its own LiteRT interpreters (``litert_run``: an interpreter
is not thread-safe) and its own ``kernel_memo`` blocks; handed over in sample order.

If the thread fails, the sample it was on (what it left half recorded undone first) and every
later one are computed on the main thread, and :attr:`Ahead.where` says so, as
``beside.Beside`` does for torch's references.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from etforge.core.common.errors import first_line

T = TypeVar("T")

#: Where the runs were computed when the thread did not fail.
AHEAD = "a thread ahead of the sample loop"


class Ahead(Generic[T]):
    """``compute(0)``, ``compute(1)``, ... ``compute(count - 1)`` on a thread started now, at
    most ``depth`` results ahead of :meth:`take`; ``undo(i)`` clears what a ``compute(i)``
    that raised had done before ``i`` is computed again on the main thread."""

    def __init__(
        self,
        compute: Callable[[int], T],
        count: int,
        depth: int,
        undo: Callable[[int], None] | None = None,
    ) -> None:
        self._compute, self._count, self._depth = compute, count, max(1, depth)
        self._undo = undo
        self._ready: dict[int, T] = {}
        self._taken = 0  # the next index :meth:`take` hands over
        self._stop = False
        #: The result the thread failed on (None: it did not).
        self.failed_at: int | None = None
        self._cond = threading.Condition()
        #: Why the thread failed (then that sample and the later ones are computed by ``take``).
        self.failed: str | None = None
        #: ``AHEAD`` or "the main thread (why)": where the results were computed.
        self.where = AHEAD
        # the caller's context variables (the host stand-ins of device payloads among them)
        run = contextvars.copy_context().run
        self._thread = threading.Thread(
            target=run, args=(self._run,), name="etforge-program-runs", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        import torch

        torch.set_num_threads(1)  # this thread's own OpenMP setting: one, as the main thread's
        for index in range(self._count):
            with self._cond:
                while not self._stop and index >= self._taken + self._depth:
                    self._cond.wait()
                if self._stop:
                    return
            try:
                value = self._compute(index)
            except BaseException as exc:  # noqa: BLE001  (told, and computed again on the main thread)
                with self._cond:
                    self.failed, self.failed_at = f"{type(exc).__name__}: {first_line(exc)}", index
                    self._cond.notify_all()
                return
            with self._cond:
                self._ready[index] = value
                self._cond.notify_all()

    def take(self, index: int) -> T:
        """Result ``index`` (taken in order): the thread's, or computed on the calling thread
        where the thread failed."""
        if index != self._taken:
            raise ValueError(f"results are taken in order: {self._taken} next, not {index}")
        with self._cond:
            while index not in self._ready and self.failed is None:
                self._cond.wait()
            here = index not in self._ready
            value = self._ready.pop(index, None)
            self._taken = index + 1
            self._cond.notify_all()
        if not here:
            return value  # type: ignore[return-value]
        self.where = f"the main thread (the other thread failed: {self.failed})"
        if index == self.failed_at and self._undo is not None:
            self._undo(index)
        return self._compute(index)

    def close(self) -> None:
        """Stop the thread (after the last result, or when the caller stops early): it
        finishes the result it is computing, if any, and computes no more."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()
