"""The placement picture (``report --html``) and its Model Explorer overlay (``--model-explorer``).

One compile with two NPU partitions and a node between them on the CPU (the max pool kept
off the NPU), so the picture has partition boxes, a CPU node with its reason and a
boundary transpose. The HTML is parsed, and rendered in headless Chromium when it is
installed (``.ci/setup`` installs it); the node data is checked against the contract of
Model Explorer's loader and, when ``ai-edge-model-explorer`` and
``pte-adapter-model-explorer`` are installed, against the node ids their adapters give
the same files.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import torch

import etforge
from etforge.codegen import model_explorer, placement_html

#: The CPU library a CPU op's namespace selects, as the picture names it.
OP_LIBRARY = {"cortex_m": "cmsis-nn", "quantized_decomposed": "quantized", "aten": "portable"}


def _model() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(32, 5),
    ).eval()
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(1, 3, 4, 4, generator=g),) for _ in range(4)]
    return model, calib[0], calib


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model, example, calib = _model()
    compiled = etforge.compile(
        model,
        example,
        target="imxrt700",
        calibration=calib,
        options={"operators_not_to_delegate": "aten.max_pool2d_with_indices.default"},
    )
    return compiled.save(tmp_path_factory.mktemp("placement") / "out")


@pytest.fixture(scope="module")
def report(out: Path) -> dict[str, Any]:
    return json.loads((out / "report.json").read_text())


class _Page(HTMLParser):
    """Elements of interest: the node groups, partition groups, anything that loads a resource."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes: dict[str, dict[str, str]] = {}
        self.partitions: list[str] = []
        self.external: list[str] = []
        self.titles: dict[str, str] = {}
        self.fills: dict[str, str] = {}
        self._in: str | None = None
        self._title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        for key in ("src", "href"):
            if key in a and not a[key].startswith("url(#"):
                self.external.append(f"{tag} {key}={a[key]}")
        if tag in ("link", "iframe", "img"):
            self.external.append(tag)
        if tag == "g" and "data-node" in a:
            self.nodes[a["data-node"]] = a
            self._in = a["data-node"]
        if tag == "g" and "data-partition" in a:
            self.partitions.append(a["data-partition"])
        if tag == "title" and self._in:
            self._title = True
        if tag == "rect" and self._in and "fill" in a:
            self.fills[self._in] = a["fill"]

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._title = False
        if tag == "g":
            self._in = None

    def handle_data(self, data: str) -> None:
        if self._title and self._in:
            self.titles[self._in] = self.titles.get(self._in, "") + data


def _parse(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    return page


def test_the_picture_draws_every_node_where_it_runs(report: dict[str, Any]) -> None:
    text = placement_html.render(report)
    assert text == placement_html.render(report)  # deterministic
    page = _parse(text)
    assert page.external == []  # self-contained: opens offline
    assert "http" not in re.sub(r'xmlns="http://www.w3.org/2000/svg"', "", text)
    names = {n["node"] for n in report["nodes"]}
    inputs = {i for n in report["nodes"] for i in n["inputs"]} - names
    assert inputs == {"input_1"} and set(page.nodes) == names | inputs
    parts = [p["name"] for p in report["partitions"]]
    assert page.partitions == parts and len(parts) == 2
    by_part: dict[str, set[str]] = {}
    for n in report["nodes"]:
        title = page.titles[n["node"]]
        assert f"MACs: {n['macs']:,}" in title and f"{n['bytes']:,} B" in title
        if n["placement"] == "npu":
            assert f"where: NPU partition {n['partition']}" in title
            assert "npu" in page.nodes[n["node"]]["class"]
            by_part.setdefault(n["partition"], set()).add(page.fills[n["node"]])
        else:  # the CPU library from the op that runs it, and why it is there
            library = OP_LIBRARY[n["cpu_op"].split(".")[0]]
            assert library in page.nodes[n["node"]]["class"], (n, page.nodes[n["node"]])
            assert f"reason: {n['reason']}" in title
            assert n["reason"] == "listed in operators_not_to_delegate"
    # one colour per partition, a different one for each
    assert all(len(f) == 1 for f in by_part.values()) and len(set().union(*by_part.values())) == 2
    transposed = [n["node"] for n in report["nodes"] if any(o["op"] == "TRANSPOSE" for o in n["litert_ops"])]
    assert transposed and all("boundary transposes:" in page.titles[t] for t in transposed)


def test_edges_follow_the_graph(report: dict[str, Any]) -> None:
    boxes = placement_html.layout(report)
    for n in report["nodes"]:
        for src in n["inputs"]:
            assert boxes[src].y < boxes[n["node"]].y  # every edge points down a row
    assert [n["inputs"] for n in report["nodes"]] == [
        ["input_1"],
        ["convolution"],
        ["relu"],
        ["max_pool2d_with_indices"],
        ["view"],
    ]


@pytest.mark.skipif(
    shutil.which("chromium") is None, reason="chromium is not installed (apt-get install chromium)"
)
def test_the_picture_renders_in_a_headless_browser(report: dict[str, Any], tmp_path: Path) -> None:
    page = tmp_path / "placement.html"
    page.write_text(placement_html.render(report))
    proc = subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    boxes = placement_html.layout(report)
    assert f'data-rendered="{len(boxes)}"' in dom  # the script ran to its end
    items = re.findall(r'<li data-node="([^"]+)"', dom)  # the node list the script built
    assert items == list(boxes)
    assert "listed in operators_not_to_delegate" in dom


def _loader_contract(data: dict[str, Any]) -> None:
    """What Model Explorer's web app reads from a node-data file keyed by graph id."""
    assert isinstance(data, dict) and data
    for graph in data.values():
        assert isinstance(graph["results"], dict) and "results" not in graph["results"]
        for result in graph["results"].values():
            assert isinstance(result["value"], (int, float, str))
            if "bgColor" in result:
                assert re.fullmatch(r"#[0-9a-f]{6}", result["bgColor"])
        for stop in graph.get("gradient", []):
            assert 0 <= stop["stop"] <= 1 and re.fullmatch(r"#[0-9a-f]{6}", stop["bgColor"])


def test_model_explorer_node_data(out: Path, report: dict[str, Any], tmp_path: Path) -> None:
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.schema import DelegateCall, KernelCall

    files = model_explorer.write(out, report, tmp_path / "me")
    assert [f.name for f in files] == ["model.pte.json", "etforge_0.tflite.json", "etforge_1.tflite.json"]
    pte = json.loads(files[0].read_text())
    _loader_contract(pte)
    program = deserialize_pte_binary((out / "model.pte").read_bytes()).program
    plan = program.execution_plan[0]
    results = pte[plan.name]["results"]
    delegates = []
    for c, chain in enumerate(plan.chains):
        for i, instr in enumerate(chain.instructions):
            node = f"{plan.name}_{c}_{i}"
            if isinstance(instr.instr_args, DelegateCall):
                delegates.append(results[node]["value"])
            elif isinstance(instr.instr_args, KernelCall):
                op = plan.operators[instr.instr_args.op_index].name
                expected = {"cortex_m": "CMSIS-NN", "quantized_decomposed": "quantized"}.get(
                    op.split("::")[0], "portable"
                )
                assert results[node]["value"] == f"CPU {expected}", (node, op)
    assert delegates == ["NPU etforge_0", "NPU etforge_1"]
    macs = {n["node"]: n["macs"] for n in report["nodes"]}
    for part, path in zip(report["partitions"], files[1:], strict=True):
        data = json.loads(path.read_text())
        _loader_contract(data)
        (graph,) = data.values()
        assert set(graph["results"]) == {str(op["index"]) for op in part["ops"]}
        total = sum(macs.get(n, 0) for n in {n for op in part["ops"] for n in op["nodes"]})  # q/dq: none
        assert sum(r["value"] for r in graph["results"].values()) == total


#: A venv with Model Explorer and its PTE adapter (``.ci/setup`` builds it): their flatbuffers pin
#: conflicts with ExecuTorch's (tosa-tools), so they run beside etforge, not inside its venv.
EXPLORER_PYTHON = Path(__file__).resolve().parents[1] / ".venv-explorer" / "bin" / "python"


@pytest.mark.skipif(not EXPLORER_PYTHON.is_file(), reason="no .venv-explorer (bash .ci/setup builds it)")
def test_node_data_ids_are_the_adapters_ids(out: Path, report: dict[str, Any], tmp_path: Path) -> None:
    """Model Explorer's own adapters load model.pte and each partition, and every node-data
    entry names a graph and node they give (else Model Explorer shows nothing for it)."""
    files = model_explorer.write(out, report, tmp_path / "me")
    models = [out / "model.pte"] + [out / "partitions" / f"{p['name']}.tflite" for p in report["partitions"]]
    proc = subprocess.run(
        [str(EXPLORER_PYTHON), str(Path(__file__).parent / "explorer" / "node_ids.py"), *map(str, models)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ids = json.loads(proc.stdout)
    for model, data_file in zip(models, files, strict=True):
        graphs = ids[str(model)]
        assert graphs and all(graphs.values()), (model, graphs)
        data = json.loads(data_file.read_text())
        assert set(data) <= set(graphs), (data_file, set(graphs))
        for graph, node_data in data.items():
            assert node_data["results"] and set(node_data["results"]) <= set(graphs[graph]), (
                data_file,
                graph,
            )
