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


if __name__ == "__main__":
    main()
