"""Where a fake kernel was registered, found without reading its source file.

``torch.library.register_fake`` records its caller as ``"file.py:line"`` (for the error a
second registration raises) through ``inspect.getframeinfo``, which also reads the caller's
source lines: ``findsource`` walks every module in ``sys.modules`` and the file. Importing
ExecuTorch's Cortex-M passes and the TOSA dialect under them registers ~300 fake kernels,
and that lookup was 0.5 s of a cortex-m33 compile's imports. The same two fields come from the
frame with ``context=0`` (no source lines read): the recorded string is unchanged. Only the
command calls :func:`record_sources_cheaply` (the library never patches torch under its host
program); with a torch whose ``get_source`` is not the one this replaces, it does nothing.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable

_original: Callable[[int], str] | None = None


def _get_source(stacklevel: int) -> str:
    """torch's ``get_source``: the caller ``stacklevel`` frames up as ``"file:line"``."""
    info = inspect.getframeinfo(sys._getframe(stacklevel), context=0)
    return f"{info.filename}:{info.lineno}"


def record_sources_cheaply() -> bool:
    """Replace torch's registration-source lookup by :func:`_get_source`; True when in place."""
    global _original
    try:
        from torch._library import utils
    except ImportError:
        return False
    current = getattr(utils, "get_source", None)
    if current is _get_source:
        return True
    if current is None or current.__code__.co_varnames[:1] != ("stacklevel",):
        return False
    _original = current
    utils.get_source = _get_source
    return True
