"""Fallbacks: every time a compile takes a second-best path, it says so (or, strict, refuses).

A fallback is a decision the user did not ask for and should hear about: the classic lowering
after the early path could not be exact, a re-lowering with everything decomposed, an op
decomposed because no kernel library provides it, ExecuTorch's Cortex-M passes re-run in
another order. Each is recorded once, where it happens, as ``(stage, what, where, why)``; the
compile collects them into ``report.json``'s ``fallbacks`` and the summary. Under
``strict`` (``etforge compile --strict``, ``etforge.compile(strict=True)``), recording one
raises :class:`StrictFallback` instead, so nothing is written.

The log lives in a context variable for the length of one compile, so plugins (a CPU backend's
``lower``) record the same way as the core, through :func:`record`, without a new hook
argument. Outside a compile, :func:`record` keeps nothing: there is no one to tell.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

from etforge.core.common.errors import EtforgeError


@dataclass(frozen=True)
class Fallback:
    stage: str  # the compile stage: front, lower, kernels, cpu_lowering ...
    what: str  # the second-best path taken
    where: str  # the node, op, pass or partition it concerns
    why: str  # why the first path could not be taken

    def line(self) -> str:
        where = f" ({self.where})" if self.where else ""
        return f"{self.stage}: {self.what}{where}: {self.why}"

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


class StrictFallback(EtforgeError):
    """A fallback under ``strict``: the compile stops before anything is written."""


@dataclass
class FallbackLog:
    strict: bool = False
    items: list[Fallback] = field(default_factory=list)


_LOG: contextvars.ContextVar[FallbackLog | None] = contextvars.ContextVar("etforge_fallbacks", default=None)


@contextlib.contextmanager
def recording(strict: bool = False) -> Iterator[FallbackLog]:
    """Collect the fallbacks of the compile run inside. Inside another ``recording`` (the CLI
    opens one around its export and the compile) the outer log is used, strict if either is."""
    outer = _LOG.get()
    if outer is not None:
        was = outer.strict
        outer.strict = was or strict
        try:
            yield outer
        finally:
            outer.strict = was
        return
    log = FallbackLog(strict=strict)
    token = _LOG.set(log)
    try:
        yield log
    finally:
        _LOG.reset(token)


def record(stage: str, what: str, where: str, why: str) -> None:
    """Tell the running compile it took a second-best path; under strict, refuse it."""
    log = _LOG.get()
    if log is None:
        return
    item = Fallback(stage, what, where, why)
    if log.strict:
        raise StrictFallback(f"strict: refusing a fallback, nothing written: {item.line()}")
    if item not in log.items:
        log.items.append(item)
