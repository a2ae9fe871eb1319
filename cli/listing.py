"""The describing commands: ``plugins``, ``targets``, ``ops`` (they never import torch)."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.table import Table

from etforge.cli.common import (
    Ctx,
    console,
    err_console,
    named_target,
    print_table,
)


@click.command()
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
            "rule_conflicts": [
                {"op": c.op, "scheme": c.scheme, "order": [list(o) for o in c.order], "note": c.note}
                for c in reg.rule_conflicts()
            ],
            "warnings": reg.coverage_warnings(),
        }
        click.echo(json.dumps(data, indent=2))
        return
    table = Table(title="etforge plugins")
    for col in ("plugin", "distribution", "version", "provides"):
        table.add_column(col, overflow="fold")
    for p in reg.plugins:
        provides = "[red]FAILED[/]: " + (p.error or "") if p.error else _provides_text(p.provides)
        table.add_row(p.name, p.distribution, p.version, provides)
    print_table(table)
    conflicts = reg.conflicts()
    if conflicts:
        ct = Table(title="converter conflicts (first is asked first)")
        for col in ("op", "target", "order", "note"):
            ct.add_column(col, overflow="fold")
        for c in conflicts:
            ct.add_row(
                c.op,
                c.target,
                " > ".join(f"{conv} ({plug}, prio {pr})" for plug, conv, pr in c.order),
                c.note,
            )
        print_table(ct)
    rule_conflicts = reg.rule_conflicts()
    if rule_conflicts:
        rt = Table(title="quantizer-rule conflicts (first annotates the op)")
        for col in ("op", "scheme", "order", "note"):
            rt.add_column(col, overflow="fold")
        for r in rule_conflicts:
            order = " > ".join(f"{kind} ({plug}, prio {pr})" for plug, kind, pr in r.order)
            rt.add_row(r.op, r.scheme, order, r.note)
        print_table(rt)
    for warning in reg.coverage_warnings():
        err_console.print(f"warning: {warning}", soft_wrap=True, markup=False)


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


@click.command()
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
        table.add_column(col, overflow="fold")
    for name, t in sorted(reg.targets.items()):
        comp = "-"
        if t.npu is not None and t.npu.compiler:
            c = compilers.get(t.npu.compiler)
            comp = f"{t.npu.compiler}: " + ((c.available()[1]) if c else "[red]no such compiler plugin[/]")
        npu = "-" if t.npu is None else _npu_text(t.npu)
        table.add_row(name, npu, f"{t.cpu_fallback} ({t.cpu})", comp, t.description)
    print_table(table)
    for name, t in sorted(reg.targets.items()):
        for fig, info in (t.npu.figures() if t.npu is not None else {}).items():
            if info["assumption"]:
                console.print(
                    f"[yellow]{name}: {fig}={info['value']} is an assumption[/] ({t.npu.assumptions[fig]})"
                )


def _npu_text(npu: Any) -> str:
    """NPU family, dtypes and its device figures, each marked as an assumption or read from the SDK."""
    figs = [
        f"{k}={v['value']} ({'assumption' if v['assumption'] else 'from the SDK'})"
        for k, v in npu.figures().items()
    ]
    return f"{npu.family}, {'/'.join(npu.dtypes)}" + (f"; {', '.join(figs)}" if figs else "")


@click.command()
@click.option("--target", "-t", "target_name", required=True, help="Target name (see `etforge targets`).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_obj
def ops(obj: Ctx, target_name: str, as_json: bool) -> None:
    """The NPU support matrix of a target: op, converter, plugin, dtypes, constraints."""
    reg = obj.registry
    target = named_target(reg, target_name)
    rows = []
    for op, cands in sorted(reg.converters_for(target).items()):
        for rank, conv in enumerate(cands):
            d = conv.describe()
            # What the target runs: the converter's dtypes the NPU executes (Neutron: int8 only).
            runs = [x for x in d["dtypes"] if target.npu is None or x in target.npu.dtypes]
            row = {"op": op, "rank": rank, "plugin": reg.owner(conv), **d}
            rows.append({**row, "dtypes": runs, "converter_dtypes": d["dtypes"]})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if target.npu is None:
        console.print(f"target {target.name!r} has no NPU: every op runs on the CPU ({target.cpu_fallback}).")
        return
    table = Table(title=f"NPU support on {target.name} ({target.npu.family})")
    for col in ("op", "converter", "plugin", "dtypes", "constraints"):
        table.add_column(col, overflow="fold")
    for r in rows:
        name = r["name"] if r["rank"] == 0 else f"{r['name']} (fallback {r['rank']})"
        table.add_row(r["op"], name, r["plugin"], ",".join(r["dtypes"]), "\n".join(r["constraints"]))
    print_table(table)
