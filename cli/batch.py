"""``etforge compile`` with several models or ``--manifest``: parallel child compiles, one table."""

from __future__ import annotations

import os
import sys
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from etforge.cli.common import (
    OUTPUT,
    Ctx,
    console,
    named_target,
    parse_options,
    print_table,
    resolved_options,
    say,
)


def compile_many(
    obj: Ctx,
    models: tuple[str, ...],
    manifest: str | None,
    target_name: str,
    out: Any,
    calib: str | None,
    float_: bool,
    raw_options: tuple[str, ...],
    jobs: int | None,
    ray_address: str | None,
    cache_args: tuple[str, ...] = (),
) -> None:
    """Models × targets × options in parallel child compiles; a summary table; exit 1 if any failed."""
    from pathlib import Path

    from etforge.core.batch import run as batch
    from etforge.core.cache import store as cache

    if manifest:
        if models:
            raise click.UsageError("give models on the command line or --manifest, not both")
        plan = batch.load_manifest(Path(manifest), out, cache_args=cache_args)
    else:
        opts = parse_options(raw_options)
        resolved_options(
            named_target(obj.registry, target_name), opts
        )  # a bad option fails before any job runs
        plan = batch.plan(
            list(models), [target_name], [opts], out, float_=float_, calib=calib, cache_args=cache_args
        )
    for target in sorted({j.target for j in plan}):
        named_target(obj.registry, target, "manifest")  # an unknown target fails before any job runs
    where = f"Ray at {ray_address}" if ray_address else f"{jobs or os.cpu_count() or 1} local workers"
    quiet = OUTPUT["quiet"]
    if not quiet:
        console.print(f"compiling {len(plan)} jobs on {where} ...")

    def done(r: batch.JobResult) -> None:
        if quiet:
            return
        mark = "[green]✓[/]" if r.ok else "[red]✗[/]"
        console.print(f"{mark} {escape(r.job.model)} → {r.job.target} {r.seconds:6.1f} s", soft_wrap=True)

    if ray_address:
        results = batch.run_ray(plan, ray_address, str(cache.default_dir()), on_done=done)
    else:
        results = batch.run_local(plan, jobs, on_done=done)
    table = Table(title=f"{sum(r.ok for r in results)} of {len(results)} compiled")
    for col in ("model", "target", "result", "time", "partitions", "NPU MACs", "note"):
        table.add_column(col, overflow="fold")
    for row in batch.summary_rows(results):
        table.add_row(*(escape(c) for c in row))
    if quiet:
        for r in results:
            if not r.ok:
                say("error", f"{r.job.model} → {r.job.target}: {r.message}")
    else:
        print_table(table)
    if not ray_address and batch.NO_FORK_NOTE:
        say("note", batch.NO_FORK_NOTE)  # each job paid torch's import: told, once
    console.print(f"{sum(r.ok for r in results)} of {len(results)} compiled into {out}")
    if not all(r.ok for r in results):
        sys.exit(1)
