"""``etforge run`` and ``verify --runtime qemu-m33``: the program on an emulated device."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

import click
from rich.markup import escape

from etforge.cli.common import (
    console,
    err_console,
)


def firmware_source_options(f: Any) -> Any:
    """--executorch-src / --cmsis-nn-src: the sources a firmware image is built from;
    --cpu-partitions: the opt-in that runs host-only NPU partitions in TFLM on the CPU."""
    f = click.option(
        "--cpu-partitions",
        is_flag=True,
        help="Run an imxrt700/imxrt700cm program's host-only NPU partitions in TensorFlow Lite Micro "
        "with CMSIS-NN on the Cortex-M33 (not the NPU; TFLM from $ETFORGE_TFLM_SRC / $ETFORGE_TFLM_DEPS, "
        "else ../shared/third_party); verify compares them with LiteRT's reference kernels.",
    )(f)
    f = click.option(
        "--cmsis-nn-src",
        default=None,
        metavar="DIR",
        help="CMSIS-NN source tree (default: $ETFORGE_CMSIS_NN_SRC; docs/firmware.md, Sources).",
    )(f)
    return click.option(
        "--executorch-src",
        default=None,
        metavar="DIR",
        help="ExecuTorch source tree (default: $ETFORGE_EXECUTORCH_SRC; docs/firmware.md, Sources).",
    )(f)


def verify_on_device(
    out: Any,
    runtime: str,
    samples: int,
    seed: int,
    et_src: str | None,
    nn_src: str | None,
    as_json: bool,
    cpu_partitions: bool = False,
) -> None:

    from etforge.runtime.firmware.sources import locate

    locate(et_src, nn_src)  # missing sources fail here, before torch is imported
    from etforge.runtime.firmware import device, summary

    with console.status(f"building the firmware image and running {out} on {runtime} ..."):
        v = device.verify(
            out, runtime, samples=samples, seed=seed, executorch_src=et_src, cmsis_nn_src=nn_src,
            cpu_partitions=cpu_partitions,
        )  # fmt: skip
    if as_json:
        click.echo(json.dumps({**dataclasses.asdict(v), "ok": v.ok}, indent=2, default=str))
        sys.exit(0 if v.ok else 1)
    for line in summary.verification_lines(v):
        console.print(escape(line), soft_wrap=True)
    if not v.ok:
        for f in v.failures:
            err_console.print(f"[red]FAIL:[/] {escape(f)}", soft_wrap=True)
        sys.exit(1)
    console.print(f"[green]verify passed on {runtime}[/]")


@click.command(name="run")
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option(
    "--on", "runtime", type=click.Choice(["qemu-m33"]), required=True, help="The device runtime to run on."
)
@click.option(
    "--samples",
    type=click.IntRange(min=1, max=10_000),
    default=4,
    show_default=True,
    help="Seeded random inputs (as verify draws them).",
)
@click.option("--seed", type=click.IntRange(min=0, max=2**63 - 1), default=0, show_default=True)
@click.option(
    "--inputs",
    default=None,
    metavar="FILE",
    type=click.Path(dir_okay=False),
    help=".npz with one array per program input (its shape, or with a leading sample dimension).",
)
@click.option(
    "--save", default=None, metavar="FILE", help="Write the outputs to FILE (.npz, out<j>[sample, ...])."
)
@click.option(
    "--profile",
    is_flag=True,
    help="Emulator instructions per Edge node and NPU partition (not device cycles); writes OUT/profile.json.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@firmware_source_options
def run_cmd(
    out_dir: str,
    runtime: str,
    samples: int,
    seed: int,
    inputs: str | None,
    save: str | None,
    profile: bool,
    as_json: bool,
    executorch_src: str | None,
    cmsis_nn_src: str | None,
    cpu_partitions: bool = False,
) -> None:
    """Build (once, cached) a firmware image of OUT's program and run it on an emulated device."""
    from pathlib import Path

    from etforge.runtime.firmware.sources import locate

    locate(executorch_src, cmsis_nn_src)  # missing sources fail here, before torch is imported
    from etforge.runtime.firmware import device, summary

    if save is not None and not save.endswith(".npz"):
        raise click.UsageError(f"--save {save}: outputs are written as a .npz file")
    with console.status(f"building the firmware image and running {out_dir} on {runtime} ..."):
        dev = device.run(
            Path(out_dir), runtime, samples=samples, inputs=Path(inputs) if inputs else None, seed=seed,
            executorch_src=executorch_src, cmsis_nn_src=cmsis_nn_src, cpu_partitions=cpu_partitions,
        )  # fmt: skip
    if save is not None:
        summary.save_outputs(dev, Path(save))
    if profile:  # per Edge node (cli/profile_view.py)
        from etforge.cli import profile_view

        per_node = profile_view.profile(Path(out_dir), dev)
    if as_json:
        click.echo(json.dumps(summary.run_json(dev) | ({"profile": per_node} if profile else {}), indent=2))
        return
    for line in summary.run_lines(dev):
        console.print(escape(line), soft_wrap=True)
    if profile:
        profile_view.show(per_node, Path(out_dir))
    if save is not None:
        console.print(f"wrote {save}")
