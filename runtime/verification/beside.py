"""Work ``verify`` runs on a thread beside its own: torch's references of every sample.

The float model's outputs, the quantized program's in float32 and in float64 depend only on the
seeded inputs and the two programs, not on anything the compiled program computes; the
figures and the top-1 gate compare them with the program's outputs after the sample loop.
Computed on a thread started before the loop, they take the machine's second core while the
main thread runs the program, the per-op gates and the device simulation: torch's kernels and
LiteRT's ``Invoke`` run without holding the interpreter lock. The same values (the same code on
the same inputs, one intra-op thread on both threads), less wall time, about the same CPU
(MobileNetV2-96 imxrt700cm, 32 samples: 6.4-6.6 -> 5.7-5.8 s wall, +0.1 CPU s). Measured and left
out: a forked child instead (+0.3 CPU s of copy-on-write faults), and the float check on a second
thread (no wall gained: its converters and the sample loop share the interpreter lock; +0.2 s).

If the thread fails, the references are computed again on the main thread, and
:attr:`Beside.where` says so.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class Beside:
    """``compute()`` on a thread started now; :meth:`result` waits for it."""

    def __init__(self, compute: Callable[[], Any]) -> None:
        self._compute = compute
        self._value: Any = None
        #: Why the thread failed (then the value is computed on the thread calling ``result``).
        self.failed: str | None = None
        self._done = False
        #: "a thread beside the sample loop" or "the main thread (why)": where they were computed.
        self.where = "a thread beside the sample loop"
        self._thread = threading.Thread(target=self._run, name="etforge-references", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import torch

        torch.set_num_threads(1)  # this thread's own OpenMP setting: one, as the main thread's
        try:
            self._value = self._compute()
        except BaseException as exc:  # noqa: BLE001  (told, and computed again on the main thread)
            self.failed = f"{type(exc).__name__}: {exc}"

    def result(self) -> Any:
        """The references; computed on the calling thread if the other one failed."""
        if not self._done:
            self._thread.join()
            if self.failed is not None:
                self.where = f"the main thread (the other thread failed: {self.failed})"
                self._value = self._compute()
            self._done = True
        return self._value
