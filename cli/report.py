"""``etforge report``: the summary, the per-node table, or the placement pictures of OUT."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from etforge.cli.common import (
    console,
    print_summary,
    print_table,
)
from etforge.core.common.errors import EtforgeError


@click.command()
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option(
    "--ops",
    "by_op",
    is_flag=True,
    help="Per Edge node: placement, LiteRT ops / CPU op and its kernel library, MACs, bytes.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--html",
    "html_file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write the placement picture: the graph, each node coloured by where it runs (opens offline).",
)
@click.option(
    "--model-explorer",
    "me_dir",
    type=click.Path(file_okay=False),
    default=None,
    metavar="DIR",
    help="Write the same overlay as Model Explorer node data for model.pte and each partition .tflite.",
)
def report(out_dir: str, by_op: bool, as_json: bool, html_file: str | None, me_dir: str | None) -> None:
    """Show the report of a compile in OUT."""
    from pathlib import Path

    from etforge.core.build import output

    output.recover(Path(out_dir))  # a swap cut short by a kill is finished first
    data = output.load_report(Path(out_dir) / output.REPORT)
    if html_file or me_dir:
        _write_pictures(Path(out_dir), data, html_file, me_dir)
        return
    if not by_op:
        if as_json:
            click.echo(json.dumps(data, indent=2))
        else:
            print_summary(data)
        return
    rows = []
    for n in data["nodes"]:
        if n["placement"] == "npu":
            ran_as = (
                ", ".join(f"{o['partition']}#{o['index']} {o['op']}" for o in n["litert_ops"]) or "(folded)"
            )
        else:
            ran_as = n["cpu_op"] or (f"(fused into {n['fused_into']})" if n.get("fused_into") else "-")
        who = f"{n['converter']} ({n['plugin']})" if n.get("converter") else "-"
        reason = n.get("reason") or ""
        if n.get("float"):  # a recorded fallback: the int8 program runs this node in float
            reason = f"in float ({', '.join(n.get('float_ops', []))}): a fallback" + (
                f"; {reason}" if reason else ""
            )
        rows.append({"node": n["node"], "op": n["op"], "placement": n["placement"], "runs_as": ran_as,
                     "kernel": n.get("kernel"), "macs": n["macs"], "bytes": n.get("bytes", 0),
                     "debug_handle": n["debug_handle"], "decided_by": who, "reason": reason})  # fmt: skip
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title=f"{data['model']} on {data['target']}: Edge node -> what runs it")
    cols = (
        "node",
        "op",
        "placement",
        "LiteRT ops / CPU op",
        "kernel",
        "decided by",
        "MACs",
        "bytes",
        "reason",
    )
    for col in cols:
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(
            r["node"], r["op"], r["placement"], r["runs_as"], r["kernel"] or "-", r["decided_by"],
            f"{r['macs']:,}", f"{r['bytes']:,}", r["reason"],
        )  # fmt: skip
    print_table(table)


def _write_pictures(out: Any, data: dict[str, Any], html_file: str | None, me_dir: str | None) -> None:
    """``report --html`` / ``--model-explorer``: each file written whole, then renamed into place."""
    from pathlib import Path

    if any("inputs" not in n for n in data.get("nodes", [])):
        raise EtforgeError(f"{out}: its report.json has no graph edges (an older etforge); recompile it")
    if html_file:
        from etforge.codegen.placement_html import render

        data = _with_profile(Path(out), data)

        path = Path(html_file)
        tmp = path.with_name(path.name + ".tmp")
        try:
            tmp.write_text(render(data), encoding="utf-8")
            tmp.replace(path)
        except OSError as exc:
            raise EtforgeError(f"{path}: cannot write the picture: {exc.strerror or exc}") from None
        console.print(f"wrote {escape(str(path))} ({len(data.get('nodes', []))} nodes)", soft_wrap=True)
    if me_dir:
        from etforge.codegen.model_explorer import write

        try:
            files = write(out, data, Path(me_dir))
        except OSError as exc:
            raise EtforgeError(f"{me_dir}: cannot write the node data: {exc.strerror or exc}") from None
        console.print(
            f"wrote Model Explorer node data: {', '.join(escape(str(f)) for f in files)}", soft_wrap=True
        )


def _with_profile(out: Any, data: dict[str, Any]) -> dict[str, Any]:
    """The report with the last ``run --profile``'s counts per node (``OUT/profile.json``), when
    it was made from this very program (its ``.pte`` hash)."""
    path = out / "profile.json"
    if not path.is_file():
        return data
    from etforge.runtime.firmware.device_profile import node_counts

    try:
        prof = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise EtforgeError(f"{path}: unreadable ({exc}); run --profile again or delete it") from None
    if prof.get("pte_sha256") != data.get("pte_sha256"):
        return data  # a profile of another compile: not shown
    counts = node_counts(prof)
    nodes = [
        n | ({"emulator_instructions": counts[n["node"]]} if n["node"] in counts else {})
        for n in data["nodes"]
    ]
    parts = {p["partition"]: p["instructions"] for p in prof.get("partitions", [])}
    partitions = [
        p | ({"emulator_instructions": parts[p["name"]]} if p.get("name") in parts else {})
        for p in data.get("partitions", [])
    ]
    return data | {"nodes": nodes, "partitions": partitions, "profile_label": prof.get("label")}
