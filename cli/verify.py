"""``etforge verify``: OUT's program (or a script's ``.pte``) against torch on the host."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from etforge.cli.common import (
    Ctx,
    console,
    defer_stack_imports,
    err_console,
    named_target,
    parse_options,
    print_table,
    resolved_options,
)
from etforge.cli.device import firmware_source_options, verify_on_device
from etforge.core.registry.manager import Registry


def _finite(value: float | None, param: Any, low: float, high: float | None = None) -> float | None:
    """A number option that must be finite and in range (click's FloatRange lets nan through)."""
    import math

    if value is None:
        return None
    if not math.isfinite(value) or value < low or (high is not None and value > high):
        span = f"{low:g} to {high:g}" if high is not None else f"at least {low:g}"
        raise click.BadParameter(f"{value!r} is not a finite number {span}", param=param)
    return value


@click.command()
@click.argument("out_dir", metavar="OUT|PTE", type=click.Path())
@click.option(
    "--model",
    "script_model",
    default=None,
    metavar="MODEL",
    help="Verify PTE, a .pte your own script produced: MODEL (zoo:NAME, file.py:factory, .pt2) is the "
    "model it was built from (with --target, --option, --calib or --quantized).",
)
@click.option("--target", "-t", "script_target", default=None, help="With --model: the target PTE is for.")
@click.option(
    "--option", "script_options", multiple=True, metavar="KEY=VALUE", help="With --model: target option."
)
@click.option(
    "--calib", "script_calib", default=None, help="With --model: the calibration data the script used."
)
@click.option(
    "--quantized",
    "script_quantized",
    type=click.Path(dir_okay=False),
    default=None,
    metavar="Q.pt2",
    help="With --model: the script's quantized program (torch.export.save); the reference is lowered from it.",
)
@click.option(
    "--samples",
    type=click.IntRange(min=1, max=10_000),  # each runs the whole program on the host: bounded
    default=32,
    show_default=True,
    help="Seeded random inputs to compare on.",
)
@click.option("--seed", type=click.IntRange(min=0, max=2**63 - 1), default=0, show_default=True)
@click.option(
    "--max-steps",
    type=float,
    default=None,
    callback=lambda ctx, param, v: _finite(v, param, low=0.0),
    help="Also fail when the int8 output is more than S steps from the quantized reference's exact "
    "value (default: reported, not gated). Every NPU op is always held to 1 step from the reference op "
    "on the same inputs, with at most 0.1% of its values one step off.",
)
@click.option(
    "--data",
    default=None,
    metavar="FILE",
    help="Labeled samples: a .npz with arrays x and y, a .pt of tensors x and y, or zoo:NAME (a trained "
    "zoo model's test split); reports float and compiled accuracy and fails on a larger drop.",
)
@click.option(
    "--max-accuracy-drop",
    type=float,
    callback=lambda ctx, param, v: _finite(v, param, low=0.0, high=100.0),
    default=1.0,
    show_default=True,
    metavar="POINTS",
    help="With --data: percentage points of accuracy the compiled program may lose.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (every field, per op).")
@click.option("--quiet", "-q", is_flag=True, help="Print only the failures and the final line.")
@click.option(
    "--kernels",
    type=click.Choice(["default", "reference"]),
    default="default",
    show_default=True,
    help="LiteRT kernels for the NPU partitions: default (float-rounded requantization, as the "
    "PT2E reference) or reference (fixed-point, as TFLite Micro / CMSIS-NN).",
)
@click.option(
    "--min-top1",
    type=click.IntRange(min=0),
    default=None,
    help="Required top-1 agreements (default: 31 of every 32 samples).",
)
@click.option(
    "--runtime",
    type=click.Choice(["host", "qemu-m33"]),
    default="host",
    show_default=True,
    help="qemu-m33: run model.pte in ExecuTorch's C++ runtime with CMSIS-NN on an emulated Cortex-M33 "
    "and require its outputs to equal the host interpreter's bit for bit (docs/firmware.md).",
)
@click.option(
    "--reconvert",
    is_flag=True,
    help="Convert the NPU partitions again from quantized.pt2 and require partitions/*.tflite byte for "
    "byte (default: those files, checked against report.json's sha256, are taken as converted).",
)
@click.option(
    "--rebuild",
    "lower_again",
    is_flag=True,
    help="Lower quantized.pt2 again (as before the compile saved its lowered program) and require "
    "lowered_edge.exir to be that program (default: the saved program, checked against report.json's "
    "sha256, runs). --reconvert implies it.",
)
@firmware_source_options
@click.pass_obj
def verify(
    obj: Ctx,
    out_dir: str,
    samples: int,
    seed: int,
    max_steps: float | None,
    min_top1: int | None,
    kernels: str,
    data: str | None,
    max_accuracy_drop: float,
    as_json: bool,
    quiet: bool,
    script_model: str | None,
    script_target: str | None,
    script_options: tuple[str, ...],
    script_calib: str | None,
    script_quantized: str | None,
    runtime: str = "host",
    executorch_src: str | None = None,
    cmsis_nn_src: str | None = None,
    cpu_partitions: bool = False,
    reconvert: bool = False,
    lower_again: bool = False,
) -> None:
    """Run OUT's program on the host (NPU partitions in LiteRT) and compare with torch.

    PTE --model MODEL --target T: verify a .pte your own ExecuTorch script produced.
    """
    from pathlib import Path

    if runtime != "host":
        if script_model is not None:
            raise click.UsageError("--runtime qemu-m33 verifies an OUT directory, not a script's .pte")
        for flag, given in (("--reconvert", reconvert), ("--rebuild", lower_again)):
            if given:
                raise click.UsageError(f"{flag} goes with the host verification (--runtime host)")
        verify_on_device(
            Path(out_dir), runtime, samples, seed, executorch_src, cmsis_nn_src, as_json, cpu_partitions
        )
        return
    reg = obj.registry
    script = _script_pte(
        reg, out_dir, script_model, script_target, script_options, script_calib, script_quantized
    )
    checks = {
        "samples": samples, "seed": seed, "max_steps": max_steps, "min_top1": min_top1,
        "kernels": kernels, "data": data, "max_accuracy_drop": max_accuracy_drop, "reconvert": reconvert,
        "lower_again": lower_again,
    }  # fmt: skip
    if script is None:
        _compiled_output(Path(out_dir))  # a wrong path fails here, before torch loads
    v = _verify_on_host(Path(out_dir), script, checks, quiet or as_json)
    _show(v, out_dir, kernels, as_json, quiet)


def _show(v: Any, out_dir: str, kernels: str, as_json: bool, quiet: bool) -> None:
    """The verification as JSON, as its failures and one line (``--quiet``), or as the verdict,
    the gates and the figures; exit 1 when it failed."""
    if as_json:
        import dataclasses

        click.echo(json.dumps({**dataclasses.asdict(v), "ok": v.ok}, indent=2, default=str))
        sys.exit(0 if v.ok else 1)
    if quiet:
        for f in v.failures:
            err_console.print(f"[red]FAIL:[/] {escape(f)}", soft_wrap=True)
        console.print(
            "[green]verify passed[/]" if v.ok else f"[red]verify failed[/] ({len(v.failures)} check(s))"
        )
        sys.exit(0 if v.ok else 1)
    compared = (
        f"{out_dir}'s model.pte on {v.samples} seeded inputs against the quantized program in the "
        f"device's arithmetic (LiteRT {kernels} kernels for the end-to-end figures)"
    )
    console.print(
        f"[green]verify passed[/]: {escape(compared)}; every gate held"
        if v.ok
        else f"[red]verify failed[/] ({len(v.failures)} check(s), listed at the end): {escape(compared)}",
        soft_wrap=True,
    )
    for title, rows in (
        ("gates (each must hold; docs/report.md)", _gate_rows(v)),
        ("figures (reported, not gated)", _figure_rows(v)),
    ):
        table = Table(title=title)
        table.add_column("metric")
        table.add_column("value")
        for row in rows:
            table.add_row(*row)
        print_table(table)
    for note in v.notes:
        console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    if not v.ok:
        for f in v.failures:
            err_console.print(f"[red]FAIL:[/] {f}")
        console.print(f"[red]verify failed[/] ({len(v.failures)} check(s))")
        sys.exit(1)
    console.print("[green]verify passed[/]")


def _script_pte(
    reg: Registry,
    out_dir: str,
    model: str | None,
    target: str | None,
    options: tuple[str, ...],
    calib: str | None,
    quantized: str | None,
) -> dict[str, Any] | None:
    """What ``--model`` says a script's PTE was built from (None: OUT is a compile's output);
    the script-only options without ``--model``, or a PTE without it, are usage errors."""
    if model is None:
        if target or options or calib or quantized:
            raise click.UsageError("--target, --option, --calib and --quantized go with --model")
        if out_dir.endswith(".pte"):
            raise click.UsageError(
                f"{out_dir} is a .pte: say which model it was built from (--model, --target)"
            )
        return None
    if not target:
        raise click.UsageError("--model needs --target: the target the .pte was built for")
    if not out_dir.endswith(".pte"):
        raise click.BadParameter(f"{out_dir!r} is not a .pte file", param_hint="PTE")
    spec = named_target(reg, target)
    return {
        "model": model,
        "target": spec.name,
        "options": resolved_options(spec, parse_options(options)),
        "calib": calib,
        "quantized": quantized,
    }


def _compiled_output(out: Any) -> None:
    """OUT holds a compile's output (``model.pte`` and a readable ``report.json``), else one
    error line naming it: the check ``runtime.verification.verify`` makes first, without importing torch."""
    from etforge.core.build import output
    from etforge.core.common.errors import EtforgeError

    output.recover(out)  # a swap cut short by a kill is finished first
    if not (out / output.REPORT).is_file() or not (out / output.PTE).is_file():
        raise EtforgeError(
            f"{out}: no compiled program here (missing {output.PTE} or {output.REPORT}); run etforge compile first"
        )
    output.load_report(out / output.REPORT)  # corrupt or foreign: named, not a traceback


def _verify_on_host(out: Any, script: dict[str, Any] | None, checks: dict[str, Any], quiet: bool) -> Any:
    """The host verification of OUT (or of a script's PTE): unless quiet, a status line saying
    which step runs and one line per finished step with what it compared and its seconds.

    ExecuTorch's imports are deferred as compile defers them (``core.common.lazy_imports``),
    and the package inits a host run does without besides (``HOST_DEFERRED_INITS``, each CPU
    backend's ``host_deferred_inits``: the Arm backend's MX formats, the CPU library's passes);
    ExecuTorch's parse of its Edge-dialect YAML comes from the cache (``cache_edge_dialect_yaml``);
    torchao's package inits are deferred too (``runtime.verification.deferred_imports``), and
    Dynamo's and Inductor's for a compile's output (``runtime.verification.deferred_dynamo``: a
    script's ``.pte`` exports its model, which runs Dynamo)."""
    from etforge.core.common import process_memory
    from etforge.core.common.lazy_imports import HOST_DEFERRED_INITS
    from etforge.core.registry.manager import registry
    from etforge.runtime.verification import deferred_dynamo, deferred_imports
    from etforge.runtime.verification.verify_steps import Steps

    cpu_inits = tuple(p for b in registry().cpu_backends.values() for p in b.host_deferred_inits)
    # what these imports allocate (torchao's ops pull in Dynamo and Inductor; ExecuTorch) lives
    # to the end: not scanned by the collector meanwhile, frozen as they end
    with process_memory.settled_imports():
        if script is None:
            deferred_dynamo.defer()  # first: before anything imports Dynamo or Inductor
        deferred_imports.defer()  # ExecuTorch's imports read torchao
        defer_stack_imports((*HOST_DEFERRED_INITS, *cpu_inits))
        import executorch.exir  # noqa: F401  (the files step's first import)

    with console.status("verify: starting") if not quiet else contextlib.nullcontext() as status:
        steps = Steps(ended=_settle_after_load)
        if status is not None:
            steps.started = lambda doing: status.update(f"verify: {escape(doing)} ...")
            steps.finished = lambda line: console.print(f"  {escape(line)}", soft_wrap=True)
        if script is not None:
            from etforge.runtime.verification.script_pte import verify_script_pte

            return verify_script_pte(out, **script, **checks, steps=steps)
        from etforge.runtime.verification.verify import verify as run_verify

        return run_verify(out, **checks, steps=steps)


def _settle_after_load(step: str) -> None:
    """Once the programs are loaded (the ``rebuild`` step), their objects live to the end:
    frozen, the collections each sample runs (``verify.compare``) no longer scan them (0.2 s
    of CPU on MobileNetV2-96), as compile settles its imports."""
    if step == "rebuild":
        from etforge.core.common import process_memory

        process_memory.settle()


Row = tuple[str, str]


def _gate_rows(v: Any) -> Iterator[Row]:
    """What each gate compared and what it found (docs/report.md: the gates)."""
    if v.pte is not None:
        yield (
            "model.pte (host interpreter) vs Edge program",
            f"{v.pte.agreed}/{v.pte.samples} samples identical"
            + ("" if v.pte.ok else f" (max |diff| {v.pte.max_abs_diff:.4g})")
            + f"; {v.pte.seconds_per_sample * 1000:.0f} ms/sample",
        )
    yield from _per_op_rows(v)
    if v.sim_max_steps is not None:
        yield (
            "whole output vs device simulation (every value)",
            "equal" if v.sim_exact else f"max {v.sim_max_steps:g} step(s)",
        )
    if v.float_max_rel is not None:
        yield (
            "NPU ops in float vs float Edge ops (relative)",
            f"max {v.float_max_rel:.2g} ({v.float_ops} ops)",
        )
    if v.top1_vs_float is not None:  # a primary float output
        exact = v.top1_vs_exact is not None
        got = v.top1_vs_exact if exact else v.top1_vs_float
        reported = got < v.top1_required and not any("top-1 agreement" in f for f in v.failures)
        yield (
            "top-1 vs quantized ref in float64" if exact else "top-1 vs float model",
            f"{got}/{v.samples} (required {v.top1_required}/{v.samples}"
            + ("; below it: reported, not gated (note)" if reported else "")
            + ")",
        )
    if v.float_accuracy is not None:
        yield (
            f"accuracy on {v.data} ({v.data_samples} samples)",
            f"float {v.float_accuracy:.2f}% · compiled {v.compiled_accuracy:.2f}% · drop "
            f"{v.accuracy_drop:.2f} points (max {v.max_accuracy_drop:g})",
        )
    if len(v.outputs) > 1 or any(o["kind"] != "float" for o in v.outputs):  # runtime.verification.outputs
        yield (
            "outputs: compared as, samples agreeing",
            "\n".join(f"{o['name']}: {o['compared_as']}, {o['agreed']}/{o['samples']}" for o in v.outputs),
        )


def _figure_rows(v: Any) -> Iterator[Row]:
    """Figures beside the gates: distances from torch's float32 evaluation and the float model
    (a random-weight net amplifies rounding torch does differently), the reference's own
    precision, what the per-op check could not compare, where the model runs."""
    if v.max_steps is not None:
        yield "max |ours - quantized ref in float32| (steps)", f"{v.max_steps:.2f}"
        yield "mean |ours - quantized ref in float32| (steps)", f"{v.mean_steps:.4f}"
    if v.max_steps_vs_exact is not None:
        yield "max |ours - quantized ref in float64| (steps)", f"{v.max_steps_vs_exact:.2f}"
    if v.reference_spread_steps is not None:
        yield (
            "quantized ref in float32 vs float64 (its own precision)",
            f"max {v.reference_spread_steps:.2f} steps; top-1 {v.reference_spread_top1}/{v.samples}",
        )
    if v.top1_vs_quantized is not None:
        yield "top-1 vs quantized ref in float32", f"{v.top1_vs_quantized}/{v.samples}"
        if v.top1_vs_exact is not None:
            yield "top-1 vs float model", f"{v.top1_vs_float}/{v.samples}"
    if v.op_max_steps is not None:
        npu_ops = [o for o in v.ops if o["partition"] != "cpu"]
        top = max(npu_ops, key=lambda o: (o["off_by_one"] / max(o["values"], 1), o["off_by_one"]))
        yield (
            "NPU op with the most values one step off",
            f"{top['partition']}:{top['node']}: {top['off_by_one']:,} of {top['values']:,} (per op: --json)",
        )
    yield (
        "values the per-op check could not compare",
        f"{v.skipped_values:,}"
        + "".join(f"; {e['partition']}:{e['node']} {e['values']:,} ({e['reason']})" for e in v.skipped[:3])
        + (f"; +{len(v.skipped) - 3} more (--json)" if len(v.skipped) > 3 else ""),
    )
    yield "max |ours - float model|", f"{v.max_abs_vs_float:.4g}"
    yield "whole model on the NPU", "yes" if v.whole_model_on_npu else "no"


def _per_op_rows(v: Any) -> Iterator[Row]:
    """Each NPU and CPU op against the reference op on the same inputs."""
    if v.exact_values:
        yield ("NPU values vs device-exact reference", f"{v.exact_values_off:,} of {v.exact_values:,} off")
    if v.op_max_steps is not None:
        yield (
            "NPU ops vs reference op, same inputs",
            f"max {v.op_max_steps} step(s); {v.op_values_off:,} of {v.op_values:,} values off "
            f"({v.op_off_by_one:,} by one step)",
        )
    if v.cpu_op_max_steps is not None:
        yield (
            "CPU ops vs reference op, same inputs",
            f"max {v.cpu_op_max_steps} step(s); {v.cpu_values_off:,} of {v.cpu_values:,} values off",
        )
    unruled = [f"{o.get('partition', 'npu')}:{o['node']}" for o in v.not_exact]
    unruled += [f"cpu:{o['node']}" for o in v.cpu_not_exact]
    if v.op_max_steps is not None or v.cpu_op_max_steps is not None:
        yield (
            "ops without a device-exact rule (compared with torch)",
            ", ".join(unruled[:4]) + (f" +{len(unruled) - 4} more (--json)" if len(unruled) > 4 else "")
            if unruled
            else "none",
        )
