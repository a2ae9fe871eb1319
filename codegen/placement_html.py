"""The placement picture: the model's graph, each node coloured by where it runs.

``etforge report OUT --html FILE`` writes one self-contained HTML page (inline SVG, CSS and
a little JavaScript; no network, no external file) from ``report.json`` alone: the Edge
nodes and the edges between them (``nodes[].inputs``), NPU partitions as group boxes,
the boundary transposes, the reason each CPU node stayed on the CPU, MACs and bytes per
node (tooltip and a side panel).

The layout is Graphviz's ``dot`` (layered: every edge points down, crossings minimized,
long edges routed around the boxes), run on the report's graph; its node positions and
edge splines are drawn here, so the page needs nothing at view time. ``dot`` is
deterministic: the same report gives the same bytes. Edges that skip a layer (residual
and skip connections) are drawn in their own colour. The page zooms (wheel, +/-), pans
(drag) and finds a node by name (the search box centres the view on it).
"""

from __future__ import annotations

import html
import json
import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any

from etforge.core.common.errors import EtforgeError

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

BOX_W, BOX_H, MARGIN = 168, 40, 28
#: Graphviz's separations, in inches (72 px): between boxes of a layer, between layers.
NODE_SEP, RANK_SEP = 0.3, 0.45
#: Seconds ``dot`` may take (a 1,000-node graph lays out in about a second).
DOT_TIMEOUT = 120


def library_of(node: dict[str, Any]) -> str:
    """``npu`` or the CPU kernel library that runs the node (from the op that runs it)."""
    if node.get("placement") == "npu":
        return NPU
    kernel = str(node.get("kernel") or "")  # the report's kernel library (fused nodes: the producer's)
    if kernel.startswith("CMSIS-NN"):
        return CMSIS_NN
    if kernel.startswith("ExecuTorch quantized"):
        return QUANTIZED
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
    #: Graphviz's spline for each input edge (input name -> points, Bezier control points).
    splines: dict[str, list[tuple[int, int]]] = field(default_factory=dict)


def layout(report: dict[str, Any]) -> dict[str, Box]:
    """Boxes in program order, each with its layer (rank), pixel position and edge splines,
    laid out by Graphviz's ``dot``."""
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
    _place(boxes)
    return boxes


def _dot_source(boxes: dict[str, Box]) -> str:
    """The graph for ``dot``: node ids are indices (no user text reaches dot's syntax)."""
    ids = {name: f"n{i}" for i, name in enumerate(boxes)}
    lines = [
        "digraph G {",
        f"graph [rankdir=TB, nodesep={NODE_SEP}, ranksep={RANK_SEP}, splines=spline, ordering=in];",
        f'node [shape=box, fixedsize=true, width={BOX_W / 72:.4f}, height={BOX_H / 72:.4f}, label=""];',
    ]
    lines += [f"{ids[name]};" for name in boxes]
    lines += [f"{ids[src]} -> {ids[box.name]};" for box in boxes.values() for src in box.inputs]
    lines.append("}")
    return "\n".join(lines) + "\n"


def _place(boxes: dict[str, Box]) -> None:
    """Run ``dot -Tplain`` and set each box's top-left corner and each edge's spline (pixels,
    y down)."""
    if not boxes:
        return
    dot = shutil.which("dot")
    if dot is None:
        raise EtforgeError(
            "report --html: Graphviz's dot is not installed; it lays out the graph "
            "(apt-get install graphviz, brew install graphviz)"
        )
    try:
        proc = subprocess.run(
            [dot, "-Tplain"], input=_dot_source(boxes), capture_output=True, text=True, timeout=DOT_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        raise EtforgeError(f"report --html: dot took over {DOT_TIMEOUT} s on {len(boxes)} nodes") from None
    if proc.returncode != 0:
        raise EtforgeError(f"report --html: dot failed: {proc.stderr.strip().splitlines()[-1:]}")
    names = list(boxes)
    height = 0.0
    edges: dict[tuple[str, str], list[tuple[int, int]]] = {}
    raw: list[list[str]] = [ln.split() for ln in proc.stdout.splitlines()]
    for parts in raw:
        if parts and parts[0] == "graph":
            height = float(parts[3])

    def px(x: str, y: str) -> tuple[int, int]:
        return round(MARGIN + float(x) * 72), round(MARGIN + 12 + (height - float(y)) * 72)

    for parts in raw:
        if parts and parts[0] == "node":
            cx, cy = px(parts[2], parts[3])
            box = boxes[names[int(parts[1][1:])]]
            box.x, box.y = cx - BOX_W // 2, cy - BOX_H // 2
        elif parts and parts[0] == "edge":
            count = int(parts[3])
            points = [px(parts[4 + 2 * i], parts[5 + 2 * i]) for i in range(count)]
            edges[(names[int(parts[1][1:])], names[int(parts[2][1:])])] = points
    for box in boxes.values():
        box.splines = {src: edges.get((src, box.name), []) for src in box.inputs}


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
        else node.get("cpu_op") or (f"fused into {node['fused_into']}" if node.get("fused_into") else "-")
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
    if node.get("emulator_instructions") is not None:  # etforge run --profile (OUT/profile.json)
        out["emulator instructions"] = f"{node['emulator_instructions']:,} (QEMU -icount, not device cycles)"
    if lib != NPU:
        out["reason"] = node.get("reason") or "not offered to the NPU"
        if node.get("float"):
            out["float"] = f"runs in float ({', '.join(node.get('float_ops', []))}): a recorded fallback"
    if _transposes(node):
        out["boundary transposes"] = ", ".join(_transposes(node))
    if node["node"] in layout_conversions:
        out["layout"] = "a CPU layout conversion (moves the tensor between NCHW and NHWC)"
    return out


def _edge(a: Box, b: Box) -> str:
    """The edge as ``dot`` routed it; one that skips a layer (a residual or skip connection)
    is drawn in its own colour so it stands out from the main chain."""
    points = b.splines.get(a.name) or [
        (a.x + BOX_W // 2, a.y + BOX_H),
        (a.x + BOX_W // 2, a.y + BOX_H),
        (b.x + BOX_W // 2, b.y),
        (b.x + BOX_W // 2, b.y),
    ]
    d = f"M{points[0][0]},{points[0][1]}"
    for i in range(1, len(points) - 2, 3):
        (x1, y1), (x2, y2), (x3, y3) = points[i : i + 3]
        d += f" C{x1},{y1} {x2},{y2} {x3},{y3}"
    skip = b.rank - a.rank > 1
    kind = "edge skip" if skip else "edge"
    marker = "arrow-skip" if skip else "arrow"
    return (
        f'<path class="{kind}" data-from="{html.escape(a.name)}" data-to="{html.escape(b.name)}" '
        f'd="{d}" marker-end="url(#{marker})"/>'
    )


def _size(n: int) -> str:
    """Bytes as the box shows them (the exact count is in the tooltip and panel)."""
    return f"{n} B" if n < 10_000 else f"{n / 1024:.0f} KiB" if n < 10_000_000 else f"{n / 2**20:.0f} MiB"


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
        f'<svg id="graph" xmlns="http://www.w3.org/2000/svg" data-width="{width}" data-height="{height}" '
        f'viewBox="0 0 {width} {height}" preserveAspectRatio="xMidYMin meet">',
        '<defs><marker id="arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" markerHeight="7" '
        'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#666"/></marker>'
        '<marker id="arrow-skip" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="7" markerHeight="7" '
        'orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#1f5fbf"/></marker></defs>',
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
        if info.get("emulator_instructions") is not None:
            label += f", {info['emulator_instructions']:,} emulator instructions"
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
        if box.data.get("bytes"):
            op = f"{_short(op, 18)} · {_size(int(box.data['bytes']))}"
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
        "<li><b>L</b>: a CPU layout conversion</li>"
        '<li><span class="swatch" style="border:0;border-top:2px dashed #1f5fbf;height:0"></span>'
        "an edge over a layer: a skip or residual connection</li></ul>"
    )


_CSS = """
body{font:13px system-ui,sans-serif;margin:0;display:flex;height:100vh}
#main{flex:1;display:flex;flex-direction:column;min-width:0}#side{width:340px;border-left:1px solid #ccc;padding:10px;overflow:auto}
#view{flex:1;min-height:0;position:relative;overflow:hidden;cursor:grab;background:#fafafa;border-top:1px solid #ddd}
#view.drag{cursor:grabbing}#graph{width:100%;height:100%;display:block}
#zoom{position:absolute;right:8px;top:8px;display:flex;gap:4px}#zoom button{font:14px system-ui;width:30px;height:26px}
h1{font-size:16px;margin:10px 12px 4px}p.sum{margin:0 12px 6px;color:#333}
.legend{list-style:none;padding:0 12px;margin:4px 0;display:flex;flex-wrap:wrap;gap:4px 14px}
.swatch{display:inline-block;width:12px;height:12px;border:1px solid #555;margin-right:4px;vertical-align:-2px}
.node rect{stroke:#444;stroke-width:1}.node text{font-size:11px;pointer-events:none}
.node text.sub{fill:#333;font-size:10px}.node.sel rect{stroke:#000;stroke-width:3}
.node:hover rect{stroke-width:2}.badge{font-weight:bold;fill:#b00}
.edge{fill:none;stroke:#888;stroke-width:1.2}.edge.skip{stroke:#1f5fbf;stroke-width:1.8;stroke-dasharray:5 3}
.node.hit rect{stroke:#c00;stroke-width:3}
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
  const svg = document.getElementById('graph');
  const view = document.getElementById('view');
  const full = {w: +svg.dataset.width, h: +svg.dataset.height};
  let box = {x: 0, y: 0, w: full.w, h: full.h};
  function apply(){ svg.setAttribute('viewBox', [box.x, box.y, box.w, box.h].map(v => v.toFixed(1)).join(' ')); }
  function fitWidth(){  // start readable: at most 1:1, the whole width in view, the top first
    const r = view.getBoundingClientRect();
    const k = r.width > 0 ? Math.max(full.w / r.width, 1) : 1;
    const w = r.width > 0 ? r.width * k : full.w, h = r.height > 0 ? r.height * k : full.h;
    box = {x: (full.w - w) / 2, y: 0, w: w, h: h}; apply();
  }
  function fitAll(){
    const r = view.getBoundingClientRect();
    const k = Math.max(full.w / Math.max(r.width, 1), full.h / Math.max(r.height, 1));
    box = {x: 0, y: 0, w: r.width * k, h: r.height * k}; apply();
  }
  function zoom(f, cx, cy){
    if (cx === undefined) { cx = box.x + box.w / 2; cy = box.y + box.h / 2; }
    box = {x: cx - (cx - box.x) * f, y: cy - (cy - box.y) * f, w: box.w * f, h: box.h * f}; apply();
  }
  function toGraph(ev){
    const r = svg.getBoundingClientRect();
    return [box.x + (ev.clientX - r.left) / r.width * box.w, box.y + (ev.clientY - r.top) / r.height * box.h];
  }
  view.addEventListener('wheel', ev => {
    ev.preventDefault();
    const [cx, cy] = toGraph(ev);
    zoom(ev.deltaY > 0 ? 1.2 : 1 / 1.2, cx, cy);
  }, {passive: false});
  let drag = null;
  view.addEventListener('mousedown', ev => { drag = [ev.clientX, ev.clientY, box.x, box.y]; view.classList.add('drag'); });
  window.addEventListener('mouseup', () => { drag = null; view.classList.remove('drag'); });
  window.addEventListener('mousemove', ev => {
    if (!drag) return;
    const r = svg.getBoundingClientRect();
    box.x = drag[2] - (ev.clientX - drag[0]) / r.width * box.w;
    box.y = drag[3] - (ev.clientY - drag[1]) / r.height * box.h; apply();
  });
  document.getElementById('zin').addEventListener('click', () => zoom(1 / 1.5));
  document.getElementById('zout').addEventListener('click', () => zoom(1.5));
  document.getElementById('zfit').addEventListener('click', fitAll);
  function centre(name){
    const g = document.querySelector('.node[data-node="' + CSS.escape(name) + '"] rect');
    if (!g) return;
    const x = +g.getAttribute('x') + +g.getAttribute('width') / 2, y = +g.getAttribute('y') + +g.getAttribute('height') / 2;
    box.x = x - box.w / 2; box.y = y - box.h / 2; apply();
  }
  function show(name){
    document.querySelectorAll('.node.sel').forEach(n => n.classList.remove('sel'));
    const g = document.querySelector('.node[data-node="' + CSS.escape(name) + '"]');
    if (g) { g.classList.add('sel'); centre(name); }
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
  const find = document.getElementById('find');
  function search(q){
    let first = null, hits = 0;
    document.querySelectorAll('.node').forEach(g => {
      const hit = q && g.dataset.node.toLowerCase().includes(q);
      g.classList.toggle('hit', !!hit);
      if (hit) { hits++; if (first === null) first = g.dataset.node; }
    });
    for (const li of list.children) li.hidden = q && !li.textContent.toLowerCase().includes(q);
    if (first !== null) centre(first);
    document.body.dataset.hits = String(hits);
  }
  find.addEventListener('input', e => search(e.target.value.toLowerCase()));
  find.addEventListener('keydown', e => {
    if (e.key === 'Enter') { const g = document.querySelector('.node.hit'); if (g) show(g.dataset.node); }
  });
  fitWidth();
  const q = new URLSearchParams(location.hash.slice(1)).get('find');
  if (q) { find.value = q; search(q.toLowerCase()); }
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
        f"{_legend(report, partitions, boxes)}\n"
        '<div id="view"><div id="zoom"><button id="zin" title="zoom in">+</button>'
        '<button id="zout" title="zoom out">&#8722;</button><button id="zfit" title="whole graph">&#9633;</button>'
        f"</div>\n{svg}</div></div>\n"
        '<div id="side"><b>Node</b> (click one)<div id="details"></div><hr>'
        '<input id="find" placeholder="find a node by name (Enter: select)"><ol id="list"></ol></div>\n'
        f'<script type="application/json" id="etforge-data">{blob}</script>\n'
        f"<script>{_JS}</script></body></html>\n"
    )
