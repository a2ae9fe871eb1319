"""Errors that name their culprit; the CLI maps them to exit code 1 without a traceback."""

from __future__ import annotations

import re

#: Terminal colour/style escapes some libraries put in their messages (torch.load's pickle errors).
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


class EtforgeError(Exception):
    """A user-facing failure (bad model, bad option, plugin failure, ...)."""


class PluginError(EtforgeError):
    """A plugin failed to load or broke the hook contract."""


class ConversionError(EtforgeError):
    """A converter met something it cannot convert; names the node and op."""

    def __init__(self, node: object, op: str, message: str) -> None:
        super().__init__(f"cannot convert node {getattr(node, 'name', node)!s} ({op}): {message}")
        self.node_name = str(getattr(node, "name", node))
        self.op = op


def strip_ansi(text: str) -> str:
    """``text`` without terminal escape codes (they garble logs and piped output)."""
    return _ANSI.sub("", text)


def first_line(exc: BaseException) -> str:
    """The first non-empty line of an exception's message, escapes stripped (for one-line errors)."""
    lines = [ln.strip() for ln in strip_ansi(str(exc)).splitlines() if ln.strip()]
    return lines[0] if lines else type(exc).__name__
