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


def _differs(path: Any, data: bytes) -> bool:
    return not path.is_file() or path.read_bytes() != data


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
@click.option(
    "--c-api",
    "c_api",
    default=None,
    metavar="NAME",
    help="Also write the C API (NAME_api.h/.cpp), the embedded program (NAME_pte.S, NAME.pte) "
    "and its static buffers; implies --prefix NAME_.",
)
@click.option("--pte-section", default=None, help="Section of the embedded program (with --c-api).")
@click.option("--arena-section", default=None, help="Section of the arenas and runtime pools (with --c-api).")
@click.option("--npu-section", default=None, help="Section of the NPU/TFLM working memory (with --c-api).")
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
    c_api: str | None = None,
    pte_section: str | None = None,
    arena_section: str | None = None,
    npu_section: str | None = None,
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
    sections = None
    if c_api is not None:
        from etforge.codegen import c_api as capi

        capi.check_c_name(c_api)  # every name checked before anything is written
        capi.check_namespace(namespace)
        prefix = f"{c_api}_"
        sections = capi.Sections(
            pte_section or capi.DEFAULT_PTE_SECTION,
            arena_section or capi.DEFAULT_ARENA_SECTION,
            npu_section or capi.DEFAULT_NPU_SECTION,
        ).checked()
    elif pte_section or arena_section or npu_section:
        raise click.BadParameter("section options need --c-api NAME", param_hint="--pte-section")
    if c_api is not None and report is None:  # refused before anything is written
        from etforge.core.common.errors import EtforgeError

        raise EtforgeError(
            f"{pte}: no report.json beside it -- not a program `etforge compile` wrote (pass --report)"
        )
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
    if c_api is not None and sections is not None:
        from etforge.codegen.c_api import generate_c_api

        before = set(result.changed)
        written = generate_c_api(Path(pte), Path(out_dir), c_api, namespace, report, sections, check=check)
        if check:
            result.changed = sorted(before | {n for n in written if _differs(Path(out_dir) / n, written[n])})
    if check:
        if result.changed:
            err_console.print(f"[red]out of date:[/] {', '.join(result.changed)} in {out_dir}")
            sys.exit(1)
        console.print(f"{out_dir} is up to date")
        return
    _print_codegen(result, out_dir)
