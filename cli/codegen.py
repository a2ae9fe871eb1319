"""``etforge codegen``: the firmware sources of a ``.pte``."""

from __future__ import annotations

import sys
from typing import Any

import click

from etforge.cli.common import (
    Ctx,
    console,
    err_console,
    say,
)


def _print_codegen(result: Any, gen_dir: Any) -> None:
    libs = ", ".join(f"{lib} {n}/{total}" for lib, (n, total) in result.per_library.items() if n)
    console.print(
        f"codegen: {len(result.registered)} operator(s) registered ({libs or 'none'} of a full build) -> {gen_dir}"
    )
    if result.missing:
        say("warning", f"no kernel library provides: {', '.join(result.missing)}")


@click.command()
@click.argument("pte", type=click.Path(dir_okay=False))
@click.option(
    "-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False), help="Where to write."
)
@click.option("--prefix", default="", help="Prefix for file names and C++ symbols.")
@click.option(
    "--namespace", default="etforge_model", show_default=True, help="C++ namespace of the generated code."
)
@click.option(
    "--report", "report_path", type=click.Path(dir_okay=False), help="report.json (default: next to PTE)."
)
@click.option(
    "--allow-missing", is_flag=True, help="Generate even when a used operator has no known kernel library."
)
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if regenerating would change the files.")
@click.option(
    "--libraries",
    default=None,
    metavar="L1,L2",
    help="Only these kernel libraries provide kernels (e.g. cortex_m,quantized,portable); default: all.",
)
@click.pass_obj
def codegen(
    obj: Ctx,
    pte: str,
    out_dir: str,
    prefix: str,
    namespace: str,
    report_path: str | None,
    allow_missing: bool,
    check: bool,
    libraries: str | None,
) -> None:
    """Generate the firmware sources for PTE: kernel registration, selective-build yaml, header, CMake."""
    from pathlib import Path

    from etforge.codegen import generate
    from etforge.core.build import output

    chosen = None
    if libraries is not None:
        from etforge.codegen.kernels import library_sizes

        chosen = tuple(x.strip() for x in libraries.split(",") if x.strip())
        unknown = sorted(set(chosen) - set(library_sizes()))
        if unknown or not chosen:
            raise click.BadParameter(
                f"unknown kernel libraries {', '.join(unknown) or '(none given)'}; known: "
                f"{', '.join(sorted(library_sizes()))}",
                param_hint="--libraries",
            )
    beside = Path(pte).parent / output.REPORT
    if report_path:
        report = output.load_report(Path(report_path))
    else:  # generate() would read it unchecked
        report = output.load_report(beside) if beside.is_file() else None
    result = generate(
        Path(pte),
        Path(out_dir),
        prefix=prefix,
        namespace=namespace,
        report=report,
        allow_missing=allow_missing,
        check=check,
        libraries=chosen,
    )
    if check:
        if result.changed:
            err_console.print(f"[red]out of date:[/] {', '.join(result.changed)} in {out_dir}")
            sys.exit(1)
        console.print(f"{out_dir} is up to date")
        return
    _print_codegen(result, out_dir)
