"""``etforge zoo``: the bundled models, their inputs and what each one is (no torch import)."""

from __future__ import annotations

import json

import click
from rich.table import Table

from etforge.cli.common import print_table


@click.command(name="zoo")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def zoo(as_json: bool) -> None:
    """List the zoo: compile one with `etforge compile zoo:NAME --target T`."""
    from etforge.zoo.catalog import CATALOG

    rows = [
        {
            "model": f"zoo:{m.name}",
            "input": list(m.input_shape),
            "dtype": "float32",
            "weights": "trained" if m.trained else "seeded random",
            "description": m.description,
        }
        for m in CATALOG
    ]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="etforge zoo: compile with `etforge compile zoo:NAME --target TARGET`")
    for col in ("model", "input", "weights", "what it is"):
        table.add_column(col, overflow="fold")
    for r in rows:
        shape = "x".join(map(str, r["input"]))
        table.add_row(r["model"], f"{r['dtype']} {shape}", r["weights"], r["description"])
    print_table(table)
