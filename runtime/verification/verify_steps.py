"""``verify``'s progress: each gate in turn, what it counted, and how long it took.

A verify of a real model runs for tens of seconds to minutes; one unchanging spinner line
says nothing about which check is running or whether it moves. Each step here reports when
it starts (the CLI's status line) and, when done, one line with what it compared and its
seconds; the seconds also go into the result (``Verification.seconds``, ``verify --json``),
which is where bench/verify.py and docs/report.md read where verify's time goes.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field


@dataclass
class Steps:
    """Progress callbacks (each may be None) and the seconds spent per step."""

    #: Called with what is being done now ("rebuilding ...", "sample 3/32 ...").
    started: Callable[[str], None] | None = None
    #: Called with one line per finished step: what it compared, then its seconds.
    finished: Callable[[str], None] | None = None
    #: Called with each finished step's key (the CLI settles the collector after the programs
    #: are loaded: ``core.common.process_memory.settle``).
    ended: Callable[[str], None] | None = None
    #: Seconds per step key, summed over the calls (the sample loop's parts add up here).
    seconds: dict[str, float] = field(default_factory=dict)

    def status(self, doing: str) -> None:
        if self.started is not None:
            self.started(doing)

    @contextlib.contextmanager
    def step(self, key: str, doing: str) -> Iterator[dict[str, str]]:
        """Time the block as ``key``; the block may set ``done["line"]`` to say what it
        compared (default: ``doing``), printed with the seconds when it ends."""
        done = {"line": ""}
        self.status(doing)
        start = time.perf_counter()
        yield done
        spent = self.add(key, start)
        if self.finished is not None:
            self.finished(f"{done['line'] or doing} ({spent:.1f} s)")
        if self.ended is not None:
            self.ended(key)

    def add(self, key: str, start: float) -> float:
        """Add the seconds since ``start`` to ``key`` (no line: a part of a larger step)."""
        spent = time.perf_counter() - start
        self.seconds[key] = self.seconds.get(key, 0.0) + spent
        return spent


#: Steps that report nothing (the API without a progress display).
def silent() -> Steps:
    return Steps()
