"""The ``etforge`` command line.

Exit codes: 0 success, 1 the job failed (bad model, plugin error under --strict, parity
above threshold ...), 2 bad usage. Describing commands never import torch.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from etforge.core.errors import EtforgeError
from etforge.core.plugin_manager import Registry, load_plugins

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


class Ctx:
    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self._registry: Registry | None = None

    @property
    def registry(self) -> Registry:
        if self._registry is None:
            self._registry = load_plugins(strict=self.strict)
            for p in self._registry.errors:
                err_console.print(f"[yellow]warning:[/] {p.error}")
        return self._registry


def _fail(message: str) -> None:
    err_console.print(f"[red]error:[/] {message}")
    sys.exit(1)


class EtforgeGroup(click.Group):
    """Turns :class:`EtforgeError` into one clear line and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except EtforgeError as exc:
            _fail(str(exc))


@click.group(cls=EtforgeGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--strict", is_flag=True, help="Treat a plugin that fails to load as a fatal error.")
@click.version_option(package_name="etforge")
@click.pass_context
def main(ctx: click.Context, strict: bool) -> None:
    """etforge: compile PyTorch models for the NXP i.MX RT700 through ExecuTorch."""
    ctx.obj = Ctx(strict)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def plugins(obj: Ctx, as_json: bool) -> None:
    """List the plugins found through the `etforge` entry points and what each provides."""
    reg = obj.registry
    if as_json:
        data = {
            "plugins": [
                {
                    "name": p.name,
                    "distribution": p.distribution,
                    "version": p.version,
                    "entry_point": p.entry_point,
                    "error": p.error,
                    "provides": {k: [_item_name(i) for i in v] for k, v in p.provides.items()},
                }
                for p in reg.plugins
            ],
            "conflicts": [
                {"op": c.op, "target": c.target, "order": [list(o) for o in c.order], "note": c.note}
                for c in reg.conflicts()
            ],
        }
        click.echo(json.dumps(data, indent=2))
        return
    table = Table(title="etforge plugins")
    for col in ("plugin", "distribution", "version", "provides"):
        table.add_column(col)
    for p in reg.plugins:
        provides = "[red]FAILED[/]: " + (p.error or "") if p.error else _provides_text(p.provides)
        table.add_row(p.name, p.distribution, p.version, provides)
    console.print(table)
    conflicts = reg.conflicts()
    if conflicts:
        ct = Table(title="converter conflicts (first is asked first)")
        for col in ("op", "target", "order", "note"):
            ct.add_column(col)
        for c in conflicts:
            ct.add_row(
                c.op,
                c.target,
                " > ".join(f"{conv} ({plug}, prio {pr})" for plug, conv, pr in c.order),
                c.note,
            )
        console.print(ct)


def _item_name(item: object) -> str:
    for attr in ("name",):
        value = getattr(item, attr, None)
        if isinstance(value, str) and value:
            return value
    ops = getattr(item, "ops", None)
    if ops:
        return "rule:" + ",".join(ops)
    return type(item).__name__


def _provides_text(provides: dict[str, list[Any]]) -> str:
    parts = []
    for key, items in provides.items():
        if items:
            names = [_item_name(i) for i in items]
            shown = ", ".join(names[:6]) + (f", … (+{len(names) - 6})" if len(names) > 6 else "")
            parts.append(f"{len(items)} {key.replace('_', ' ')}: {shown}")
    return "\n".join(parts) or "nothing"


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def targets(obj: Ctx, as_json: bool) -> None:
    """List the compilation targets."""
    reg = obj.registry
    compilers = reg.npu_compilers
    if as_json:
        click.echo(json.dumps([t.describe() for _, t in sorted(reg.targets.items())], indent=2))
        return
    table = Table(title="etforge targets")
    for col in ("target", "NPU", "CPU fallback", "NPU compiler", "description"):
        table.add_column(col)
    for name, t in sorted(reg.targets.items()):
        comp = "-"
        if t.npu is not None and t.npu.compiler:
            c = compilers.get(t.npu.compiler)
            comp = f"{t.npu.compiler}: " + ((c.available()[1]) if c else "[red]no such compiler plugin[/]")
        npu = "-" if t.npu is None else f"{t.npu.family} ({t.npu.num_macs} MACs)"
        table.add_row(name, npu, f"{t.cpu_fallback} ({t.cpu})", comp, t.description)
    console.print(table)


@main.command()
@click.option("--target", "-t", "target_name", required=True, help="Target name (see `etforge targets`).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def ops(obj: Ctx, target_name: str, as_json: bool) -> None:
    """The NPU support matrix of a target: op, converter, plugin, dtypes, constraints."""
    reg = obj.registry
    target = reg.target(target_name)
    rows = []
    for op, cands in sorted(reg.converters_for(target).items()):
        for rank, conv in enumerate(cands):
            d = conv.describe()
            rows.append({"op": op, "rank": rank, "plugin": reg.owner(conv), **d})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if target.npu is None:
        console.print(f"target {target.name!r} has no NPU: every op runs on the CPU ({target.cpu_fallback}).")
        return
    table = Table(title=f"NPU support on {target.name} ({target.npu.family})")
    for col in ("op", "converter", "plugin", "dtypes", "constraints"):
        table.add_column(col)
    for r in rows:
        name = r["name"] if r["rank"] == 0 else f"{r['name']} (fallback {r['rank']})"
        table.add_row(r["op"], name, r["plugin"], ",".join(r["dtypes"]), "\n".join(r["constraints"]))
    console.print(table)


def _parse_options(pairs: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for pair in pairs:
        if "=" not in pair:
            raise click.BadParameter(f"{pair!r} is not key=value", param_hint="--option")
        key, value = pair.split("=", 1)
        out[key.strip()] = value.strip()
    return out


@main.command(name="compile")
@click.argument("model")
@click.option(
    "--target",
    "-t",
    "target_name",
    default="imxrt700cm",
    show_default=True,
    help="Target (see `etforge targets`).",
)
@click.option(
    "-o", "--output", "out_dir", required=True, type=click.Path(file_okay=False), help="Output directory."
)
@click.option(
    "--calib", "calib", type=click.Path(), help="Calibration data: a .pt file with a list of input tuples."
)
@click.option("--float", "float_", is_flag=True, help="Do not quantize (float32).")
@click.option(
    "--option", "raw_options", multiple=True, metavar="KEY=VALUE", help="Target option (repeatable)."
)
@click.option(
    "--etrecord", is_flag=True, help="Also write OUT/model.etrecord for ExecuTorch's devtools Inspector."
)
@click.option(
    "--memory-budget", type=int, default=None, metavar="BYTES", help="Fail if the planned arena is larger."
)
@click.pass_obj
def compile_cmd(
    obj: Ctx,
    model: str,
    target_name: str,
    out_dir: str,
    calib: str | None,
    float_: bool,
    raw_options: tuple[str, ...],
    etrecord: bool,
    memory_budget: int | None,
) -> None:
    """Compile MODEL (zoo:NAME, path/file.py:factory or a .pt2 file) into OUT/model.pte."""
    from pathlib import Path

    from etforge.core import output

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise EtforgeError(f"output {out} exists and is not a directory")
    if out.is_dir():
        output.clear_previous(out)  # whatever happens next, no stale program looks current
    reg = obj.registry
    target = reg.target(target_name)
    try:
        options = target.parse_options(_parse_options(raw_options))
    except ValueError as exc:
        raise EtforgeError(str(exc)) from None
    with console.status("loading torch, executorch and the model ..."):
        from etforge.core.compiler import compile_model
        from etforge.core.load import load_calibration, load_model
        from etforge.core.report import build_report

        loaded = load_model(model)
        calibration = loaded.calibration
        if calib:
            calibration = load_calibration(calib, loaded.example_inputs)
    out.mkdir(parents=True, exist_ok=True)
    result = compile_model(
        loaded.module,
        loaded.example_inputs,
        target,
        calibration=calibration,
        options=options,
        quantize=not float_,
        program=loaded.program,
        reg=reg,
        progress=_progress,
        what=model,
    )
    from etforge.core.memory import check_budget, memory_stats

    check_budget(memory_stats(result.executorch), memory_budget)
    with _progress("write"):
        report = build_report(result, reg, model)
        output.write_outputs(out, result, report)
    if etrecord:
        with _progress("etrecord"):
            output.write_etrecord(out, result)
    with _progress("codegen"):
        from etforge.codegen import generate

        generated = generate(out / output.PTE, out / "codegen", report=report)
    _print_summary(report, out)
    _print_codegen(generated, out / "codegen")


def _progress(stage: str) -> Any:
    import contextlib
    import time

    @contextlib.contextmanager
    def run() -> Any:
        start = time.perf_counter()
        with console.status(f"{stage} ..."):
            yield
        console.print(f"[green]✓[/] {stage:<10} {time.perf_counter() - start:6.2f} s")

    return run()


def _print_summary(report: dict[str, Any], out: Any) -> None:
    from etforge.core.report import summary_rows

    table = Table(title=f"{report['model']} on {report['target']}")
    for col in ("node", "op", "placement", "partition", "decided by", "MACs", "reason"):
        table.add_column(col, overflow="fold")
    for row in summary_rows(report):
        table.add_row(*row)
    console.print(table)
    macs = report["macs"]
    console.print(
        f"NPU MACs: {macs['npu']:,} of {macs['total']:,} ({100 * macs['npu_share']:.1f}%) · "
        f"partitions: {len(report['partitions'])} · "
        f"boundary transposes: {sum(p['boundary_transposes'] for p in report['partitions'])} "
        f"(+{len(report['cpu_layout_conversions'])} on the CPU) · "
        f"arena: {', '.join(f'{b:,} B' for b in report['memory']['arena_bytes'])} "
        f"(lower bound {report['memory']['lower_bound_bytes']:,} B) · "
        f"flash: {report['memory']['flash_bytes']:,} B · "
        f".pte: {report['memory']['pte_bytes']:,} B"
    )
    for note in report.get("notes", []):
        console.print(f"[yellow]note:[/] {note}")
    if report["host_only"]:
        console.print(f"[yellow]NPU partitions are host-only:[/] {report['npu_compiler']['status']}")
    console.print(f"wrote {out}/model.pte, {out}/partitions/, {out}/report.json")


@main.command()
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option(
    "--ops", "by_op", is_flag=True, help="Per Edge node: placement, LiteRT ops / Cortex-M op, MACs."
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def report(out_dir: str, by_op: bool, as_json: bool) -> None:
    """Show the report of a compile in OUT."""
    from pathlib import Path

    path = Path(out_dir) / "report.json"
    if not path.is_file():
        raise EtforgeError(f"{out_dir}: no report.json here; run etforge compile first")
    data = json.loads(path.read_text())
    if not by_op:
        if as_json:
            click.echo(json.dumps(data, indent=2))
        else:
            _print_summary(data, out_dir)
        return
    rows = []
    for n in data["nodes"]:
        if n["placement"] == "npu":
            ran_as = (
                ", ".join(f"{o['partition']}#{o['index']} {o['op']}" for o in n["litert_ops"]) or "(folded)"
            )
        else:
            ran_as = n["cpu_op"] or "-"
        rows.append({"node": n["node"], "op": n["op"], "placement": n["placement"], "runs_as": ran_as, "macs": n["macs"],
                     "debug_handle": n["debug_handle"]})  # fmt: skip
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=f"{data['model']} on {data['target']}: Edge node -> what runs it")
    for col in ("node", "placement", "LiteRT ops / CPU op", "MACs"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r["node"], r["placement"], r["runs_as"], f"{r['macs']:,}")
    console.print(table)


def _print_codegen(result: Any, gen_dir: Any) -> None:
    libs = ", ".join(f"{lib} {n}/{total}" for lib, (n, total) in result.per_library.items() if n)
    console.print(
        f"codegen: {len(result.registered)} operator(s) registered ({libs or 'none'} of a full build) -> {gen_dir}"
    )
    if result.missing:
        err_console.print(f"[yellow]warning:[/] no kernel library provides: {', '.join(result.missing)}")


@main.command()
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
) -> None:
    """Generate the firmware sources for PTE: kernel registration, selective-build yaml, header, CMake."""
    from pathlib import Path

    from etforge.codegen import generate

    report = json.loads(Path(report_path).read_text()) if report_path else None
    result = generate(
        Path(pte),
        Path(out_dir),
        prefix=prefix,
        namespace=namespace,
        report=report,
        allow_missing=allow_missing,
        check=check,
    )
    if check:
        if result.changed:
            err_console.print(f"[red]out of date:[/] {', '.join(result.changed)} in {out_dir}")
            sys.exit(1)
        console.print(f"{out_dir} is up to date")
        return
    _print_codegen(result, out_dir)


@main.command()
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--samples", default=32, show_default=True, help="Seeded random inputs to compare on.")
@click.option("--seed", default=0, show_default=True)
@click.option(
    "--max-steps",
    type=float,
    default=None,
    help="Fail when the int8 output is more steps from the quantized reference's exact value (whole "
    "model on the NPU). Default: 3, or torch's own float32 distance from that value when larger. "
    "Every NPU op is always held to 1 step from the reference op on the same inputs.",
)
@click.option(
    "--kernels",
    type=click.Choice(["default", "reference"]),
    default="default",
    show_default=True,
    help="LiteRT kernels for the NPU partitions: default (float-rounded requantization, as the "
    "PT2E reference) or reference (fixed-point, as TFLite Micro / CMSIS-NN).",
)
@click.option(
    "--min-top1", type=int, default=None, help="Required top-1 agreements (default: samples - samples/32)."
)
@click.pass_obj
def verify(
    obj: Ctx,
    out_dir: str,
    samples: int,
    seed: int,
    max_steps: float | None,
    min_top1: int | None,
    kernels: str,
) -> None:
    """Run OUT's program on the host (NPU partitions in LiteRT) and compare with torch."""
    from pathlib import Path

    _ = obj.registry
    with console.status("rebuilding and running the program on the host ..."):
        from etforge.runtime.verify import verify as run_verify

        v = run_verify(
            Path(out_dir), samples=samples, seed=seed, max_steps=max_steps, min_top1=min_top1, kernels=kernels
        )
    table = Table(title=f"verify {out_dir} ({v.samples} seeded inputs, LiteRT {kernels} kernels)")
    table.add_column("metric")
    table.add_column("value")
    if v.max_steps is not None:
        table.add_row("max |ours - quantized ref| (steps)", f"{v.max_steps:.2f}")
        table.add_row("mean |ours - quantized ref| (steps)", f"{v.mean_steps:.4f}")
    if v.top1_vs_quantized is not None:
        table.add_row("top-1 agreement vs quantized ref", f"{v.top1_vs_quantized}/{v.samples}")
        if v.top1_vs_exact is not None:
            table.add_row(
                "top-1 agreement vs quantized ref in float64",
                f"{v.top1_vs_exact}/{v.samples} (required {v.top1_required}/{v.samples})",
            )
        table.add_row("top-1 agreement vs float model", f"{v.top1_vs_float}/{v.samples}")
    if v.op_max_steps is not None:
        table.add_row(
            "NPU ops vs reference op, same inputs",
            f"max {v.op_max_steps} step(s); {v.op_values_off:,} of {v.op_values:,} values off",
        )
    if v.cpu_op_max_steps is not None:
        table.add_row(
            "CPU ops vs reference op, same inputs",
            f"max {v.cpu_op_max_steps} step(s); {v.cpu_values_off:,} of {v.cpu_values:,} values off",
        )
    if v.reference_spread_steps is not None:
        table.add_row(
            "quantized ref in float32 vs float64 (its own precision)",
            f"max {v.reference_spread_steps:.2f} steps; top-1 {v.reference_spread_top1}/{v.samples}",
        )
        table.add_row("max |ours - quantized ref in float64| (steps)", f"{v.max_steps_vs_exact:.2f}")
    table.add_row("max |ours - float|", f"{v.max_abs_vs_float:.4g}")
    table.add_row("whole model on the NPU", "yes" if v.whole_model_on_npu else "no")
    console.print(table)
    if not v.ok:
        for f in v.failures:
            err_console.print(f"[red]FAIL:[/] {f}")
        sys.exit(1)
    console.print("[green]verify passed[/]")


if __name__ == "__main__":
    main()
