"""``etforge cmake-dir``: where ``find_package(etforge CONFIG)`` finds the CMake package, and
the configure-time helper that package calls (``cmake-runtime``, hidden)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("cmake-dir")
def cmake_dir_cmd() -> None:
    """Print the directory for find_package(etforge CONFIG): pass it as -Detforge_DIR=..."""
    click.echo(str(cmake_dir()))


def cmake_dir() -> Path:
    """``codegen.cmake_runtime.cmake_dir``, imported when called: ``etforge.codegen``'s package
    init imports the generator (jinja2, yaml), which no other command's start-up needs."""
    from etforge.codegen.cmake_runtime import cmake_dir as package_dir

    return package_dir()


@click.command("cmake-runtime", hidden=True)
@click.option("--executorch-src", required=True, type=click.Path(file_okay=False))
@click.option("--cmsis-nn-src", required=True, type=click.Path(file_okay=False))
@click.option("--cpu", required=True)
@click.option("--include-dir", required=True, type=click.Path(file_okay=False))
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False))
@click.option("--cpu-partitions", is_flag=True, help="host-only NPU partitions run in TFLM on the CPU")
@click.option("--tflm-src", type=click.Path(file_okay=False))
@click.option("--tflm-deps", type=click.Path(file_okay=False))
@click.argument("ptes", nargs=-1, type=click.Path(dir_okay=False))
def cmake_runtime_cmd(
    executorch_src: str,
    cmsis_nn_src: str,
    cpu: str,
    include_dir: str,
    out: str,
    cpu_partitions: bool,
    tflm_src: str | None,
    tflm_deps: str | None,
    ptes: tuple[str, ...],
) -> None:
    """Write the source lists and flags etforge_add_runtime builds (called by CMake at configure time)."""
    from etforge.codegen.cmake_runtime import write_runtime_cmake

    write_runtime_cmake(
        Path(out), Path(executorch_src), Path(cmsis_nn_src), cpu, Path(include_dir), [Path(p) for p in ptes],
        cpu_partitions, Path(tflm_src) if tflm_src else None, Path(tflm_deps) if tflm_deps else None,
    )  # fmt: skip
