"""The compile summary people read: one screen (80 columns) whatever the model's size.

At most 16 lines (``summary_lines``) unless fallbacks or warnings need more, so with the
eight stage lines above it ``compile``'s default output fits an 80x24 terminal. No line is
cut: text is wrapped between words, and notes beyond the bound are counted, not shown.

The per-node detail lives in ``etforge report OUT --ops``; this gives the figures that
matter (NPU share, partitions, the CPU's ops grouped with the reason each stayed there,
memory, flash, the host-only note) in a bounded number of lines.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from typing import Any

#: Groups of CPU ops and notes shown; the rest is counted and left to ``report --ops``.
MAX_CPU_GROUPS = 2
MAX_NOTES = 2


def _fill(text: str, width: int, indent: str = "", hang: str = "    ") -> list[str]:
    """Wrapped at ``width`` between words, never cut: a line may carry the fix."""
    return textwrap.wrap(
        text,
        width=width,
        initial_indent=indent,
        subsequent_indent=indent + hang,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [indent]


def cpu_groups(report: dict[str, Any]) -> list[tuple[int, str, str, str]]:
    """(count, Edge op, what runs it, reason) for the nodes off the NPU, most frequent first."""
    groups: Counter[tuple[str, str, str]] = Counter()
    no_npu = report.get("has_npu") is False  # every node is the CPU's: say what runs it
    for n in report["nodes"]:
        if n.get("placement") == "npu":
            continue
        runs = n.get("cpu_op") or n.get("placement") or "cpu"
        why = n.get("reason") or "not offered to the NPU"
        if n.get("fused_into"):
            runs, why = "fused", f"fused into its producer's {n.get('kernel')} kernel"
        elif no_npu and n.get("kernel"):
            why = f"{n['kernel']} kernel" + (", in float (a fallback)" if n.get("float") else "")
        groups[(n.get("op", "?"), runs, why)] += 1
    return [
        (c, op, runs, why) for (op, runs, why), c in sorted(groups.items(), key=lambda kv: (-kv[1], kv[0]))
    ]


#: Said (summary and ``compile --json``) when no calibration data was given.
CALIBRATION_WARNING = (
    "warning: calibrated on the example input alone (1 sample): the int8 ranges fit that one "
    "input and real inputs may clip; pass real data with --calib FILE (.pt: a list of input "
    "tuples; .npz: x with one sample per row) or calibration= in the API"
)

#: Lines of the summary at most (``compile`` prints its eight stage lines above it).
MAX_LINES = 16


def _pack(items: list[str], width: int, indent: str, hang: str = "    ") -> list[str]:
    """Items joined with " · ", lines broken only between items."""
    lines = [indent]
    for item in items:
        cur = lines[-1]
        if cur.strip() and len(cur) + 3 + len(item) > width:
            lines.append(indent + hang + item)
        else:
            lines[-1] = cur + (" · " if cur.strip() else "") + item
    return lines


def summary_lines(report: dict[str, Any], out: str | None = None, width: int = 80) -> list[str]:
    """Plain-text lines, each at most ``width`` columns (bar a single word longer than that).

    Nothing is cut mid-text: every line is wrapped between words (a reason, a fallback or a
    note may end with the fix). The bound of :data:`MAX_LINES` is kept by showing whole notes
    only while they fit, and naming how many more ``report.json`` holds; fallbacks and the
    float-check warning are always shown whole, whatever their length.
    """
    lines: list[str] = []
    macs = report.get("macs", {})
    total = macs.get("total", 0)
    parts = report.get("partitions", [])
    head = f"{report.get('model', '?')} on {report.get('target', '?')}: "
    if parts or macs.get("npu"):
        head += f"{100 * macs.get('npu_share', 0.0):.1f}% of {total:,} MACs on the NPU"
    else:
        head += f"every op on the CPU ({report.get('cpu_backend', 'cpu')}), {total:,} MACs"
    lines += _fill(head, width)
    if parts:
        ops = sum(p.get("litert_ops", 0) for p in parts)
        transposes = sum(p.get("boundary_transposes", 0) for p in parts)
        cpu_conversions = len(report.get("cpu_layout_conversions", []))
        lines += _fill(
            f"  NPU: {len(parts)} partition(s), {ops} LiteRT ops, {transposes} boundary transposes"
            + (f" (+{cpu_conversions} on the CPU)" if cpu_conversions else ""),
            width,
        )
    groups = cpu_groups(report)
    off = sum(g[0] for g in groups)
    if groups:
        lines += _fill(f"  CPU: {off} node(s) ({report.get('cpu_backend', 'cpu')})", width)
        for count, op, runs, why in groups[:MAX_CPU_GROUPS]:
            via = f" as {runs}" if runs not in (op, "portable") else ""
            lines += _fill(f"{count}× {op}{via}: {why}", width, "    ")
        if len(groups) > MAX_CPU_GROUPS:
            rest = sum(g[0] for g in groups[MAX_CPU_GROUPS:])
            lines += _fill(
                f"+{rest} more in {len(groups) - MAX_CPU_GROUPS} group(s): report --ops", width, "    "
            )
    mem = report.get("memory", {})
    arena = ", ".join(f"{b:,} B" for b in mem.get("arena_bytes", [])) or "0 B"
    lines += _pack(
        [
            f"memory: arena {arena} (lower bound {mem.get('lower_bound_bytes', 0):,} B)",
            f"flash {mem.get('flash_bytes', 0):,} B",
            f".pte {mem.get('pte_bytes', 0):,} B",
        ],
        width,
        "  ",
    )
    if mem.get("npu_partitions"):
        parts = ", ".join(f"{p['name']} {p['working_bytes']:,} B" for p in mem["npu_partitions"])
        where = "the device figure comes from the NPU compiler, when it is installed"
        # host-only partitions: what they need on the CPU instead (memory.fallback_arena_source)
        fallback = [p for p in mem["npu_partitions"] if "fallback_arena_bytes" in p]
        if fallback:
            where = "in TFLM on the CPU instead: " + ", ".join(
                f"{p['name']} {p['fallback_arena_bytes']:,} B" for p in fallback
            )
        lines += _fill(f"NPU working memory: {parts} (etforge's host estimate; {where})", width, "  ")
    same = report.get("float_equivalence") or {}
    if same.get("passed") is False:  # verify fails this build
        lines += _fill(
            f"warning: the compiled model does not compute the exported one: {same.get('why')}; "
            "verify fails this build",
            width,
        )
    if (report.get("calibration") or {}).get("example_only"):  # int8 ranges from one input
        lines += _fill(CALIBRATION_WARNING, width)
    for fb in report.get("fallbacks", []):  # second-best paths: never cut, never silent
        where = f" ({fb.get('where')})" if fb.get("where") else ""
        lines += _fill(f"fallback: {fb.get('what')}{where}: {fb.get('why')}", width)
    tail: list[str] = []
    if report.get("host_only"):
        status = report.get("npu_compiler", {}).get("status", "")
        tail += _fill(f"host-only: {status}", width)
    if out is not None:
        tail.append(f"per node: etforge report {out} --ops")  # one line: a long path stays whole
    notes = summary_notes(report)
    shown = 0
    for note in notes[:MAX_NOTES]:
        text = _fill(f"note: {note}", width)
        more = 1 if shown + 1 < len(notes) else 0  # room for the "+N more" line
        if len(lines) + len(text) + len(tail) + more > MAX_LINES:
            break
        lines += text
        shown += 1
    if shown < len(notes):
        where = f"etforge report {out} --json" if out is not None else "report.json"
        lines += _fill(f"note: +{len(notes) - shown} more ({where})", width)
    return lines + tail


def summary_notes(report: dict[str, Any]) -> list[str]:
    """The report's notes, then each device figure decided with that is not vendor data."""
    notes = list(report.get("notes", []))
    for fig, info in (report.get("npu_figures") or {}).items():
        if isinstance(info, dict) and info.get("assumption"):
            notes.append(f"NPU {fig}={info.get('value')} is an {info.get('source')}")
    return notes


def final_line(report: dict[str, Any], out: str) -> str:
    """The one line ``compile --quiet`` prints: where the program is and the NPU share."""
    macs = report.get("macs", {})
    share = (
        f"{100 * macs.get('npu_share', 0.0):.1f}% of {macs.get('total', 0):,} MACs on the NPU"
        if report.get("partitions") or macs.get("npu")
        else f"every op on the CPU ({report.get('cpu_backend', 'cpu')})"
    )
    pte = report.get("memory", {}).get("pte_bytes", 0)
    host = "; NPU parts host-only" if report.get("host_only") else ""
    return f"compiled {report.get('model', '?')} for {report.get('target', '?')}: {out} ({pte:,} B .pte, {share}{host})"


def summary_data(report: dict[str, Any], out: str | None = None) -> dict[str, Any]:
    """What the summary says, as data (``compile --json``); nothing cut, every note kept."""
    macs = report.get("macs", {})
    mem = report.get("memory", {})
    notes = summary_notes(report)
    return {
        "model": report.get("model"),
        "target": report.get("target"),
        "out": out,
        "macs": {k: macs.get(k) for k in ("total", "npu", "npu_share")},
        "partitions": [
            {k: p.get(k) for k in ("name", "litert_ops", "boundary_transposes", "host_only")}
            for p in report.get("partitions", [])
        ],
        "cpu_layout_conversions": len(report.get("cpu_layout_conversions", [])),
        "cpu": {
            "backend": report.get("cpu_backend"),
            "nodes": sum(g[0] for g in cpu_groups(report)),
            "groups": [
                {"count": c, "op": op, "runs_as": runs, "reason": why}
                for c, op, runs, why in cpu_groups(report)
            ],
        },
        "memory": {
            k: mem.get(k)
            for k in ("arena_bytes", "lower_bound_bytes", "flash_bytes", "pte_bytes", "npu_partitions")
        },
        "notes": notes,
        "fallbacks": list(report.get("fallbacks", [])),
        "calibration": report.get("calibration"),
        "warnings": [CALIBRATION_WARNING.removeprefix("warning: ")]
        if (report.get("calibration") or {}).get("example_only")
        else [],
        "float_equivalence": report.get("float_equivalence"),
        "host_only": bool(report.get("host_only")),
        "npu_compiler": (report.get("npu_compiler") or {}).get("status"),
    }
