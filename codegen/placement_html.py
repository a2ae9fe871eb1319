"""The placement picture: the model's graph, each node coloured by where it runs.

``etforge report OUT --html FILE`` writes one self-contained HTML page (inline SVG, CSS and
a little JavaScript; no network, no external file) from ``report.json`` alone: the Edge
nodes and the edges between them (``nodes[].inputs``), NPU partitions as group boxes,
the boundary transposes, the reason each CPU node stayed on the CPU, MACs and bytes per
node (tooltip and a side panel).

The layout is deterministic and done here: a node's row is its longest path from an
input (topological rank); within a row, nodes are ordered by the mean column of their
inputs (one barycentre pass), then by partition and program order. The same report gives
the same bytes.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field
from typing import Any

#: Where a node runs, as the picture names it (the colour key).
NPU, CMSIS_NN, QUANTIZED, PORTABLE, INPUT = "npu", "cmsis-nn", "quantized", "portable", "input"

#: Fill colours: NPU partitions cycle through the greens/blues, CPU libraries are warm.
NPU_COLOURS = ("#7fc97f", "#80b1d3", "#b3de69", "#8dd3c7", "#a6cee3", "#ccebc5")
CPU_COLOURS = {CMSIS_NN: "#fdb462", QUANTIZED: "#bc80bd", PORTABLE: "#fb8072", INPUT: "#ffffff"}
LIBRARY_TITLES = {
    CMSIS_NN: "CPU: CMSIS-NN (cortex_m::)",
    QUANTIZED: "CPU: ExecuTorch quantized kernels",
    PORTABLE: "CPU: ExecuTorch portable kernels",
    INPUT: "program input",
}

BOX_W, BOX_H, GAP_X, GAP_Y, MARGIN = 168, 40, 24, 30, 28


def library_of(node: dict[str, Any]) -> str:
    """``npu`` or the CPU kernel library that runs the node (from the op that runs it)."""
    if node.get("placement") == "npu":
        return NPU
    runs = str(node.get("cpu_op") or "")
    if runs.startswith("cortex_m."):
        return CMSIS_NN
    if runs.startswith("quantized_decomposed."):
        return QUANTIZED
    return PORTABLE


@dataclass
class Box:
    """One drawn node: its report entry (or a program input) and its place."""

    name: str
    data: dict[str, Any]
    rank: int = 0
    col: float = 0.0
    x: int = 0
    y: int = 0
    inputs: list[str] = field(default_factory=list)


def layout(report: dict[str, Any]) -> dict[str, Box]:
    """Boxes in program order, each with its row (rank) and pixel position."""
    nodes = report.get("nodes", [])
    names = {n["node"] for n in nodes}
    boxes: dict[str, Box] = {}
    for n in nodes:  # program inputs first, where a node first reads them
        for src in n.get("inputs", []):
            if src not in names and src not in boxes:
                boxes[src] = Box(src, {"node": src, "placement": INPUT})
    for n in nodes:
        boxes[n["node"]] = Box(
            n["node"], n, inputs=[i for i in n.get("inputs", []) if i in names or i in boxes]
        )
    for box in boxes.values():  # program order is a topological order
        box.rank = 1 + max((boxes[i].rank for i in box.inputs), default=-1)
    rows: dict[int, list[Box]] = {}
    for order, box in enumerate(boxes.values()):
        box.col = order  # first: program order
        rows.setdefault(box.rank, []).append(box)
    for rank in sorted(rows):
        row = rows[rank]
        for box in row:
            if box.inputs:
                box.col = sum(boxes[i].col for i in box.inputs) / len(box.inputs)
        row.sort(key=lambda b: (b.col, str(b.data.get("partition") or "~"), list(boxes).index(b.name)))
        for i, box in enumerate(row):
            box.col = i
    width = max((len(r) for r in rows.values()), default=1)
    for rank, row in rows.items():
        offset = (width - len(row)) * (BOX_W + GAP_X) / 2  # rows centred
        for i, box in enumerate(row):
            box.x = int(MARGIN + offset + i * (BOX_W + GAP_X))
            box.y = int(MARGIN + 12 + rank * (BOX_H + GAP_Y))
    return boxes


def _colour(box: Box, partitions: list[str]) -> str:
    lib = INPUT if box.data.get("placement") == INPUT else library_of(box.data)
    if lib == NPU:
        part = box.data.get("partition")
        index = partitions.index(part) if part in partitions else 0
        return NPU_COLOURS[index % len(NPU_COLOURS)]
    return CPU_COLOURS[lib]


def _transposes(node: dict[str, Any]) -> list[str]:
    return [
        f"{o['partition']}#{o['index']}" for o in node.get("litert_ops", []) if o.get("op") == "TRANSPOSE"
    ]


def node_details(node: dict[str, Any], layout_conversions: set[str]) -> dict[str, Any]:
    """What the tooltip and side panel say about one node (plain data, also for tests)."""
    if node.get("placement") == INPUT:
        return {"node": node["node"], "where": LIBRARY_TITLES[INPUT]}
    lib = library_of(node)
    where = f"NPU partition {node.get('partition')}" if lib == NPU else LIBRARY_TITLES[lib]
    runs = (
        ", ".join(f"{o['partition']}#{o['index']} {o['op']}" for o in node.get("litert_ops", []))
        or "(folded)"
        if lib == NPU
        else node.get("cpu_op") or "-"
    )
    out = {
        "node": node["node"],
        "op": node.get("op"),
        "where": where,
        "runs as": runs,
        "decided by": f"{node['converter']} ({node['plugin']})" if node.get("converter") else "-",
        "MACs": f"{node.get('macs', 0):,}",
        "output": (
            f"{node['dtype']} {node['shape']}: {node.get('bytes', 0):,} B"
            if node.get("shape") is not None
            else "-"
        ),
    }
    if lib != NPU:
        out["reason"] = node.get("reason") or "not offered to the NPU"
    if _transposes(node):
        out["boundary transposes"] = ", ".join(_transposes(node))
    if node["node"] in layout_conversions:
        out["layout"] = "a CPU layout conversion (moves the tensor between NCHW and NHWC)"
    return out


def _edge(a: Box, b: Box) -> str:
    x1, y1 = a.x + BOX_W // 2, a.y + BOX_H
    x2, y2 = b.x + BOX_W // 2, b.y
    bend = max(GAP_Y, (y2 - y1) // 2)
    return (
        f'<path class="edge" d="M{x1},{y1} C{x1},{y1 + bend} {x2},{y2 - bend} {x2},{y2}" '
        f'marker-end="url(#arrow)"/>'
    )


def _short(text: str, chars: int) -> str:
    return text if len(text) <= chars else text[: chars - 1] + "…"


def render(report: dict[str, Any]) -> str:
    """The whole page as a string (deterministic for a given report)."""
    boxes = layout(report)
    partitions = [p.get("name") for p in report.get("partitions", [])]
    conversions = set(report.get("cpu_layout_conversions", []))
    # wide enough for a partition's label beside the narrowest graph
    width = max(max((b.x for b in boxes.values()), default=0) + BOX_W + MARGIN, 480)
    height = max((b.y for b in boxes.values()), default=0) + BOX_H + MARGIN
    svg: list[str] = [
        f'<svg id="graph" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}">',
        '<defs><marker id="arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" markerHeight="7" '
        'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#666"/></marker></defs>',
    ]
    for part in partitions:  # group boxes under everything else
        members = [
            b for b in boxes.values() if b.data.get("partition") == part and b.data.get("placement") == NPU
        ]
        if not members:
            continue
        x0 = min(b.x for b in members) - 10
        y0 = min(b.y for b in members) - 22
        x1 = max(b.x for b in members) + BOX_W + 10
        y1 = max(b.y for b in members) + BOX_H + 10
        info = next(p for p in report["partitions"] if p.get("name") == part)
        label = f"NPU {part}: {info.get('litert_ops', 0)} LiteRT ops, {info.get('boundary_transposes', 0)} transposes"
        svg.append(
            f'<g class="partition" data-partition="{html.escape(part)}"><rect x="{x0}" y="{y0}" '
            f'width="{x1 - x0}" height="{y1 - y0}" rx="8"/><text x="{x0 + 6}" y="{y0 + 14}">'
            f"{html.escape(label)}</text></g>"
        )
    for box in boxes.values():
        for src in box.inputs:
            svg.append(_edge(boxes[src], box))
    details = {}
    for box in boxes.values():
        d = node_details(box.data, conversions)
        details[box.name] = d
        lib = INPUT if box.data.get("placement") == INPUT else library_of(box.data)
        op = str(box.data.get("op") or "input").removeprefix("aten.").removesuffix(".default")
        tip = "\n".join(f"{k}: {v}" for k, v in d.items())
        badges = ""
        if _transposes(box.data):
            badges += f'<text class="badge" x="{box.x + BOX_W - 14}" y="{box.y + 13}">T</text>'
        if box.name in conversions:
            badges += f'<text class="badge" x="{box.x + BOX_W - 26}" y="{box.y + 13}">L</text>'
        svg.append(
            f'<g class="node {lib}" data-node="{html.escape(box.name)}" tabindex="0">'
            f"<title>{html.escape(tip)}</title>"
            f'<rect x="{box.x}" y="{box.y}" width="{BOX_W}" height="{BOX_H}" rx="5" '
            f'fill="{_colour(box, partitions)}"/>'
            f'<text x="{box.x + 6}" y="{box.y + 16}">{html.escape(_short(box.name, 24))}</text>'
            f'<text class="sub" x="{box.x + 6}" y="{box.y + 32}">{html.escape(_short(op, 27))}</text>'
            f"{badges}</g>"
        )
    svg.append("</svg>")
    return _page(report, "\n".join(svg), details, partitions, boxes)


def _legend(report: dict[str, Any], partitions: list[str], boxes: dict[str, Box]) -> str:
    items = []
    for i, part in enumerate(partitions):
        n = sum(
            1 for b in boxes.values() if b.data.get("partition") == part and b.data.get("placement") == NPU
        )
        items.append((NPU_COLOURS[i % len(NPU_COLOURS)], f"NPU partition {part} ({n} nodes)"))
    for lib in (CMSIS_NN, QUANTIZED, PORTABLE):
        n = sum(1 for b in boxes.values() if b.data.get("placement") != INPUT and library_of(b.data) == lib)
        if n:
            items.append((CPU_COLOURS[lib], f"{LIBRARY_TITLES[lib]} ({n} nodes)"))
    rows = "".join(
        f'<li><span class="swatch" style="background:{c}"></span>{html.escape(t)}</li>' for c, t in items
    )
    return (
        f'<ul class="legend">{rows}<li><b>T</b>: a boundary transpose in the partition</li>'
        "<li><b>L</b>: a CPU layout conversion</li></ul>"
    )


_CSS = """
body{font:13px system-ui,sans-serif;margin:0;display:flex;height:100vh}
#main{flex:1;overflow:auto}#side{width:340px;border-left:1px solid #ccc;padding:10px;overflow:auto}
h1{font-size:16px;margin:10px 12px 4px}p.sum{margin:0 12px 6px;color:#333}
.legend{list-style:none;padding:0 12px;margin:4px 0;display:flex;flex-wrap:wrap;gap:4px 14px}
.swatch{display:inline-block;width:12px;height:12px;border:1px solid #555;margin-right:4px;vertical-align:-2px}
.node rect{stroke:#444;stroke-width:1}.node text{font-size:11px;pointer-events:none}
.node text.sub{fill:#333;font-size:10px}.node.sel rect{stroke:#000;stroke-width:3}
.node:hover rect{stroke-width:2}.badge{font-weight:bold;fill:#b00}
.edge{fill:none;stroke:#888;stroke-width:1.2}
.partition rect{fill:none;stroke:#2a7;stroke-dasharray:6 4;stroke-width:1.5}.partition text{font-size:11px;fill:#176;paint-order:stroke;stroke:#fff;stroke-width:4px}
#side dl{margin:0}#side dt{font-weight:bold;margin-top:6px}#side dd{margin:0;word-break:break-all}
#find{width:100%;box-sizing:border-box;margin:6px 0}#list{padding-left:16px;margin:4px 0}
#list li{cursor:pointer}#list li.cpu{color:#a30}
"""

_JS = """
(function(){
  const data = JSON.parse(document.getElementById('etforge-data').textContent);
  const panel = document.getElementById('details');
  const list = document.getElementById('list');
  function show(name){
    document.querySelectorAll('.node.sel').forEach(n => n.classList.remove('sel'));
    const g = document.querySelector('.node[data-node="' + CSS.escape(name) + '"]');
    if (g) { g.classList.add('sel'); g.scrollIntoView({block: 'center', inline: 'center'}); }
    const d = data.nodes[name] || {};
    panel.replaceChildren();
    const dl = document.createElement('dl');
    for (const [k, v] of Object.entries(d)) {
      const dt = document.createElement('dt'); dt.textContent = k;
      const dd = document.createElement('dd'); dd.textContent = v;
      dl.append(dt, dd);
    }
    panel.append(dl);
  }
  for (const name of data.order) {
    const li = document.createElement('li');
    const d = data.nodes[name];
    li.textContent = name + ' \\u2014 ' + d.where + (d.reason ? ' (' + d.reason + ')' : '');
    li.dataset.node = name;
    if (String(d.where).startsWith('CPU')) li.className = 'cpu';
    li.addEventListener('click', () => show(name));
    list.append(li);
  }
  document.querySelectorAll('.node').forEach(g => g.addEventListener('click', () => show(g.dataset.node)));
  document.getElementById('find').addEventListener('input', e => {
    const q = e.target.value.toLowerCase();
    for (const li of list.children) li.hidden = q && !li.textContent.toLowerCase().includes(q);
  });
  document.body.dataset.rendered = String(data.order.length);
})();
"""


def _page(
    report: dict[str, Any], svg: str, details: dict[str, Any], partitions: list[str], boxes: dict[str, Box]
) -> str:
    macs = report.get("macs", {})
    title = f"{report.get('model', '?')} on {report.get('target', '?')}"
    summary = (
        f"{100 * macs.get('npu_share', 0.0):.1f}% of {macs.get('total', 0):,} MACs on the NPU · "
        f"{len(partitions)} NPU partition(s) · "
        f"{sum(p.get('boundary_transposes', 0) for p in report.get('partitions', []))} boundary transposes · "
        f"{len(report.get('cpu_layout_conversions', []))} CPU layout conversions · "
        f"{sum(1 for n in report.get('nodes', []) if n.get('placement') != 'npu')} node(s) on the CPU"
    )
    data = {"order": list(boxes), "nodes": details}
    # "</" cannot end the script element early: JSON escapes it.
    blob = json.dumps(data, sort_keys=True).replace("</", "<\\/")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(title)} — etforge placement</title><style>{_CSS}</style></head>\n"
        f'<body><div id="main"><h1>{html.escape(title)}</h1><p class="sum">{html.escape(summary)}</p>'
        f"{_legend(report, partitions, boxes)}\n{svg}</div>\n"
        '<div id="side"><b>Node</b> (click one)<div id="details"></div><hr>'
        '<input id="find" placeholder="find a node"><ol id="list"></ol></div>\n'
        f'<script type="application/json" id="etforge-data">{blob}</script>\n'
        f"<script>{_JS}</script></body></html>\n"
    )
