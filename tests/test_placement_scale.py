"""``report --html`` at 150+ nodes: Graphviz's layered layout, skip connections drawn apart from
the main chain, search by node name, zoom and pan — checked in headless Chromium with a
screenshot (codegen/placement_html.py).

The model is 32 of torchvision's own ResNet ``BasicBlock``s (165 Edge nodes on cortex-m33):
every block's residual edge skips the two convolutions of its main path.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import etforge
from etforge.codegen import placement_html

from support import torchvision_models

BLOCKS = 32
#: The skip edges' stroke (placement_html's CSS), as the screenshot's pixels show it.
SKIP_RGB = (0x1F, 0x5F, 0xBF)

needs_tools = pytest.mark.skipif(
    shutil.which("chromium") is None or shutil.which("dot") is None,
    reason="chromium and graphviz are installed by .ci/setup",
)


class DeepResNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        block = torchvision_models().resnet.BasicBlock
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
        self.blocks = nn.Sequential(*[block(8, 8) for _ in range(BLOCKS)])
        self.head = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(1, 3, 8, 8, generator=g),) for _ in range(2)]
    return etforge.compile(DeepResNet().eval(), calib[0], target="cortex-m33", calibration=calib).report


def _residual_edges(report: dict[str, Any]) -> set[tuple[str, str]]:
    """(block input, add) for every block: the add's input that is not its second conv's path."""
    rows = {n["node"]: n for n in report["nodes"]}
    out = set()
    for n in report["nodes"]:
        if n["op"] == "aten.add.Tensor":
            for src in n["inputs"]:
                if rows[src]["op"] != "aten.convolution.default":  # the shortcut, not the conv path
                    out.add((src, n["node"]))
    return out


@needs_tools
def test_a_150_node_graph_is_laid_out_with_visible_skip_connections(
    report: dict[str, Any], tmp_path: Path
) -> None:
    assert len(report["nodes"]) >= 150
    boxes = placement_html.layout(report)
    for b in boxes.values():  # every edge points down; no two boxes overlap
        assert all(boxes[i].y + placement_html.BOX_H <= b.y for i in b.inputs), b.name
    spots = [(b.x, b.y) for b in boxes.values()]
    for i, (x1, y1) in enumerate(spots):
        for x2, y2 in spots[i + 1 :]:
            apart = abs(y2 - y1) >= placement_html.BOX_H or abs(x2 - x1) >= placement_html.BOX_W
            assert apart, (x1, y1, x2, y2)
    text = placement_html.render(report)
    assert text == placement_html.render(report)  # deterministic
    skips = set(re.findall(r'<path class="edge skip" data-from="([^"]+)" data-to="([^"]+)"', text))
    residual = _residual_edges(report)
    assert len(residual) == BLOCKS and residual <= skips, residual - skips
    page = tmp_path / "placement.html"
    page.write_text(text)
    shot = tmp_path / "shot.png"
    proc = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--window-size=1400,900", f"--screenshot={shot}", page.as_uri()],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0 and shot.is_file(), proc.stderr[-2000:]
    from PIL import Image

    pixels = Image.open(shot).convert("RGB").getdata()
    near = sum(1 for p in pixels if all(abs(a - b) <= 40 for a, b in zip(p, SKIP_RGB, strict=True)))
    assert near > 200, f"no skip connection visible in the first screen ({near} pixels)"


@needs_tools
def test_search_finds_a_node_and_centres_the_view(report: dict[str, Any], tmp_path: Path) -> None:
    page = tmp_path / "placement.html"
    page.write_text(placement_html.render(report))
    target = next(n["node"] for n in reversed(report["nodes"]) if n["op"] == "aten.add.Tensor")
    proc = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1400,900",
         "--dump-dom", page.as_uri() + f"#find={target}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    dom = proc.stdout
    assert f'data-rendered="{len(placement_html.layout(report))}"' in dom, proc.stderr[-2000:]
    assert re.search(r'data-hits="1"', dom), dom[:500]
    assert re.search(rf'<g class="node [^"]* hit" data-node="{target}"', dom)
    view = re.search(r'<svg id="graph"[^>]* viewBox="([-\d. ]+)"', dom)
    assert view is not None
    x, y, w, h = map(float, view.group(1).split())
    box = placement_html.layout(report)[target]
    assert x <= box.x and box.x + placement_html.BOX_W <= x + w and y <= box.y <= y + h  # in view
    assert y > 0  # panned down from the top: the last add is far below the first screen
