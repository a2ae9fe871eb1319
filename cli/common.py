"""What every command shares: the consoles, the one-line ``error:``/``warning:`` output, tables
that stay greppable when piped, the plugin registry loaded once per run, and the usage checks of
``--target``/``--option``."""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from etforge.core.common.errors import EtforgeError, strip_ansi
from etforge.core.registry.manager import Registry, load_plugins, use_as_default

#: The reader of stdout went away (``etforge compile ... | head -1``).
PIPE = {"broken": False}
#: Exit code after a broken pipe: 128 + SIGPIPE, what a shell reports for a process the
#: signal stopped (``yes | head -1``); the command itself ran to its end.
BROKEN_PIPE_EXIT = 141


class _Console(Console):
    """A console that survives its reader going away: output stops, the command goes on.

    Rich's default exits at once (code 1), which killed a compile mid-way, its output
    discarded, when ``| head`` closed the pipe; here the rest is dropped and the command
    finishes (``EtforgeGroup`` reports the broken pipe in one line at the end).
    """

    def on_broken_pipe(self) -> None:
        self.quiet = True
        PIPE["broken"] = True
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.file.fileno())
            os.close(devnull)


console = _Console(highlight=False)
err_console = _Console(stderr=True, highlight=False)
#: ``--quiet`` / ``--json``: no progress lines, no summary (only errors and the final line).
OUTPUT = {"quiet": False}
#: ``--debug`` seen (the environment variable works before the options are parsed, too).
DEBUG = {"on": os.environ.get("ETFORGE_DEBUG", "") not in ("", "0")}


#: Columns of piped output when ``$COLUMNS`` does not say (a terminal's own width wins).
PIPED_WIDTH = 100


def fit_width() -> None:
    """Piped, rich would assume 80 columns; the output is 100 wide unless ``$COLUMNS`` says."""
    if not console.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
        console.width = PIPED_WIDTH


def print_table(table: Table) -> None:
    """A table as wide as the output; one too wide for it becomes records.

    On a terminal rich fits the table to it. Piped, a table that fits ``console.width`` is
    printed as is; a wider one (long op names, constraints, reasons) is printed one record
    per row — the first cell on its own line, then ``column: value`` lines wrapped at the
    width only between words — so every name stays whole for ``grep`` and no line is
    hundreds of columns wide.
    """
    import io

    if console.is_terminal:
        console.print(table)
        return
    probe = Console(highlight=False, width=100_000, file=io.StringIO())
    probe.print(table)
    if max((len(ln.rstrip()) for ln in probe.file.getvalue().splitlines()), default=0) <= console.width:
        console.print(table)
        return
    console.print(table_records(table, console.width), markup=False, highlight=False, soft_wrap=True)


def table_records(table: Table, width: int) -> str:
    """``table`` as plain-text records at most ``width`` columns wide (bar a single longer word)."""
    import textwrap

    from rich.text import Text

    def plain(cell: Any) -> str:
        return cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain

    headers = [plain(c.header) for c in table.columns]
    columns = [[plain(cell) for cell in c.cells] for c in table.columns]
    lines = [plain(table.title)] if table.title else []
    for row in zip(*columns, strict=True):
        if len(row) == 2:  # a key/value table (verify's): one "key: value" record per row
            text = f"{row[0]}: {' '.join(row[1].split())}"
            lines += textwrap.wrap(
                text, width=width, subsequent_indent="    ", break_long_words=False, break_on_hyphens=False
            ) or [text]
            continue
        lines.append(row[0])
        for header, value in zip(headers[1:], row[1:], strict=True):
            parts = [v for v in value.split("\n") if v.strip()]
            if not parts:
                continue
            first = f"    {header}: {parts[0]}" if len(parts) == 1 else f"    {header}:"
            rest = [] if len(parts) == 1 else [f"      {v}" for v in parts]
            for text in [first, *rest]:
                lines += textwrap.wrap(
                    text,
                    width=width,
                    subsequent_indent="        ",
                    break_long_words=False,
                    break_on_hyphens=False,
                ) or [text]
    return "\n".join(lines)


class Ctx:
    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self._registry: Registry | None = None

    @property
    def registry(self) -> Registry:
        if self._registry is None:
            # Loaded once per run; the pipeline (and anything asking ``registry()``) uses it.
            self._registry = use_as_default(load_plugins(strict=self.strict))
            for p in self._registry.errors:
                say("warning", str(p.error))
        return self._registry


def say(kind: str, message: str) -> None:
    """One ``error:``/``warning:`` line on stderr: no markup, no escape codes, never wrapped."""
    colour = "red" if kind == "error" else "yellow"
    err_console.print(f"[{colour}]{kind}:[/] {escape(strip_ansi(message))}", soft_wrap=True)


def fail(message: str, code: int = 1) -> None:
    if DEBUG["on"]:
        traceback.print_exc()
    say("error", message)
    sys.exit(code)


def named_target(reg: Registry, name: str, hint: str = "--target") -> Any:
    """The target named on the command line; an unknown name is a usage error (exit 2)."""
    try:
        return reg.target(name)
    except EtforgeError as exc:
        raise click.BadParameter(str(exc), param_hint=hint) from None


def resolved_options(target: Any, raw: dict[str, str]) -> dict[str, Any]:
    """``--option`` pairs checked against the target; an unknown name or bad value exits 2."""
    from etforge.core.registry.options import resolve_options

    try:
        return resolve_options(target, raw)
    except EtforgeError as exc:
        raise click.BadParameter(str(exc), param_hint="--option") from None


def parse_options(pairs: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        if "=" not in pair:
            raise click.BadParameter(f"{pair!r} is not key=value", param_hint="--option")
        key, value = pair.split("=", 1)
        out[key.strip()] = value.strip()
    return out


def print_summary(report: dict[str, Any], out: Any = None, generated: Any = None) -> None:
    """The one-screen summary (``core.build.summary``); the per-node table is ``report --ops``."""
    from etforge.core.build.summary import summary_lines

    for line in summary_lines(report, str(out) if out is not None else None, width=min(console.width, 100)):
        console.print(escape(line), soft_wrap=True)
    warn_missing_kernels(generated)


def warn_missing_kernels(generated: Any) -> None:
    if generated is not None and generated.missing:
        say("warning", f"no kernel library provides: {', '.join(generated.missing)}")


def defer_stack_imports(inits: tuple[str, ...] | None = None) -> None:
    """What a command that loads ExecuTorch defers before it does (``core.common.lazy_imports``):
    ExecuTorch's Edge-dialect YAML parse taken from the cache when the cache is on (installed
    first: the package stand-ins import the module that parses it), Inductor's post-grad passes,
    and the package inits ``inits`` (default ``DEFERRED_INITS``)."""
    from etforge.core.cache import store
    from etforge.core.common import lazy_imports

    if store.enabled():  # a parse keyed by its text (``--no-cache`` is the build cache's switch)
        lazy_imports.cache_edge_dialect_yaml(store.default_dir())
    lazy_imports.defer_inductor_post_grad()
    lazy_imports.defer_package_inits(lazy_imports.DEFERRED_INITS if inits is None else inits)
