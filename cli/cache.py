"""``etforge cache``: where the build cache is, how big, prune or clear it."""

from __future__ import annotations

import sys
from typing import Any

import click

from etforge.cli.common import (
    console,
    say,
)


@click.group()
def cache() -> None:
    """The build cache (docs/batch.md): where it is, how big, prune or clear it."""


def _size(text: str) -> int:
    """``--max-size``: bytes, or a number with K/M/G/T; a finite, non-negative amount."""
    import math

    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    raw = text.strip().upper().removesuffix("B").removesuffix("I")
    number, unit = (raw[:-1], raw[-1]) if raw and raw[-1] in units else (raw, "")
    try:
        value = float(number)
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not a size (bytes, or a number with K/M/G)", param_hint="--max-size"
        ) from None
    if not math.isfinite(value):
        raise click.BadParameter(f"{text!r} is not a finite size", param_hint="--max-size")
    if value < 0:
        raise click.BadParameter(f"{text!r} is negative", param_hint="--max-size")
    return int(value * units[unit])


def _cache_done(root: Any, removed: list[Any], errors: list[str]) -> None:
    """What a prune or clear did: builds removed, then each failure; exit 1 if any."""
    freed = sum(e.bytes for e in removed)
    damaged = sum(not e.intact for e in removed)
    extra = f", {damaged} of them damaged (no intact manifest)" if damaged else ""
    console.print(f"{root}: removed {len(removed)} builds ({freed:,} B){extra}", soft_wrap=True)
    for line in errors:
        say("error", line)
    if errors:
        sys.exit(1)


@cache.command(name="info")
def cache_info() -> None:
    """Where the cache is, its entries and their size."""
    from etforge.core.cache.store import BuildCache

    c = BuildCache()
    try:
        entries = c.entries()
    except OSError as exc:
        say("error", f"cannot read the build cache {c.root}: {exc.strerror or type(exc).__name__}")
        sys.exit(1)
    damaged = [e for e in entries if not e.intact]
    console.print(f"{c.root}: {len(entries)} builds, {sum(e.bytes for e in entries):,} B", soft_wrap=True)
    for e in damaged:
        console.print(f"  damaged (no intact manifest; prune removes it): {e.path}", soft_wrap=True)


@cache.command(name="prune")
@click.option("--max-size", default="1G", show_default=True, help="Keep at most this much (bytes, K/M/G).")
@click.option(
    "--older-than",
    type=click.FloatRange(min=0),
    default=None,
    metavar="DAYS",
    help="Also drop unused builds.",
)
def cache_prune(max_size: str, older_than: float | None) -> None:
    """Remove damaged builds, then the least recently used until the cache fits."""
    import math

    from etforge.core.cache.store import BuildCache

    if older_than is not None and not math.isfinite(older_than):
        raise click.BadParameter(f"{older_than!r} is not a finite number of days", param_hint="--older-than")
    size = _size(max_size)
    c = BuildCache()
    try:
        removed, errors = c.prune(size, older_than * 86400 if older_than is not None else None)
    except OSError as exc:
        removed, errors = [], [f"cannot read the build cache {c.root}: {exc.strerror or type(exc).__name__}"]
    _cache_done(c.root, removed, errors)


@cache.command(name="clear")
def cache_clear() -> None:
    """Remove every build (damaged ones included) and the kept parses of ExecuTorch's YAML."""
    import shutil

    from etforge.core.cache.store import BuildCache, default_dir
    from etforge.core.common.lazy_imports import EDGE_YAML_DIR

    c = BuildCache()
    try:
        removed, errors = c.prune(0)
    except OSError as exc:
        removed, errors = [], [f"cannot read the build cache {c.root}: {exc.strerror or type(exc).__name__}"]
    parses = default_dir() / EDGE_YAML_DIR
    if parses.is_dir():
        shutil.rmtree(parses, onerror=lambda _f, p, e: errors.append(f"cannot remove {p} ({e[1]})"))
    _cache_done(c.root, removed, errors)
