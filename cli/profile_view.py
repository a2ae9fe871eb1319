"""``etforge run OUT --on qemu-m33 --profile``: the run's instructions per Edge node and per NPU
partition (``runtime/firmware/device_profile.py``), printed and written to ``OUT/profile.json`` (which
``etforge report OUT --html`` then shows per node)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from etforge.cli.common import console, print_table
from etforge.core.common.errors import EtforgeError

PROFILE = "profile.json"


def profile(out: Path, dev: Any) -> dict[str, Any]:
    """Map the first sample's per-instruction counts onto the report's nodes; write it whole."""
    from etforge.runtime.firmware.device_profile import per_node

    if not dev.per_op:
        raise EtforgeError(f"{out}: --profile: {dev.per_op_note or 'the run has no per-instruction counts'}")
    report = json.loads((out / "report.json").read_text())
    if not report.get("instruction_handles"):
        raise EtforgeError(
            f"{out}: --profile: its report.json has no instruction_handles (an older etforge); recompile it"
        )
    data = {
        "runtime": dev.runtime,
        "sample": 0,
        "pte_sha256": report.get("pte_sha256"),
        **per_node(report, dev.per_op),
    }
    tmp = out / (PROFILE + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tmp.replace(out / PROFILE)
    return data


def show(data: dict[str, Any], out: Path) -> None:
    table = Table(title=f"instructions per Edge node, sample 0 ({data['label']})")
    for col in ("node", "op", "ran as", "instructions", "share"):
        table.add_column(col, overflow="fold")
    total = max(int(data["total"]), 1)
    rows = [
        (r["node"], str(r["op"]), ", ".join(r["kernel_ops"]), int(r["instructions"])) for r in data["nodes"]
    ]
    rows += [(f"NPU {p['partition']}", "delegate", "", int(p["instructions"])) for p in data["partitions"]]
    rows += [
        (f"instruction {o['instruction']}", "(no Edge node)", o["op"], int(o["instructions"]))
        for o in data["other"]
    ]
    for node, op, ran, count in sorted(rows, key=lambda r: -r[3]):
        table.add_row(node, op, ran, f"{count:,}", f"{100 * count / total:.1f}%")
    print_table(table)
    console.print(
        escape(f"total {data['total']:,} emulator instructions (not device cycles); wrote {out / PROFILE}"),
        soft_wrap=True,
    )
