"""``etforge run OUT --on qemu-m33 --profile``: QEMU's instruction counts per ExecuTorch
instruction, mapped to the Edge nodes of the report through the emitter's debug handles
(runtime/firmware/device_profile.py), labelled as emulator counts; ``report --html`` then shows them.

One firmware run of a cortex-m33 program: conv, PReLU (int8 parts), ceil-mode pool, linear.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from torch import nn

import etforge

from support import run_cli


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.p1 = nn.Conv2d(3, 8, 3), nn.PReLU(8)
        self.pool = nn.MaxPool2d(2, 2, ceil_mode=True)
        self.fc = nn.Linear(8 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.p1(self.c1(x))).flatten(1))


def test_run_profile_maps_instructions_to_edge_nodes(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    from test_firmware import _missing

    if _missing() is not None:
        pytest.skip(str(_missing()))
    from etforge.runtime.firmware import build

    cache = os.environ.get(build.ENV_CACHE) or str(request.config.cache.mkdir("etforge-firmware"))
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn((1, 3, 10, 10), generator=g),) for _ in range(3)]
    compiled = etforge.compile(Small().eval(), calib[0], target="cortex-m33", calibration=calib)
    out = compiled.save(tmp_path / "out")
    compiled.codegen(out / "codegen")
    r = run_cli("run", str(out), "--on", "qemu-m33", "--samples", "1", "--profile", "--json",
                env={build.ENV_CACHE: cache})  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    run = json.loads(r.stdout)
    prof = run["profile"]
    assert prof == json.loads((out / "profile.json").read_text())
    assert "not device cycles" in prof["label"]
    # every instruction counted once: nodes + partitions + the rest = the per-op total
    per_op = run["per_op"]
    counted = sum(n["instructions"] for n in prof["nodes"]) + sum(o["instructions"] for o in prof["other"])
    assert counted == prof["total"] == sum(i["instructions"] for i in per_op) > 0
    rows = {row["node"]: row for row in prof["nodes"]}
    nodes = {n["node"]: n for n in compiled.report["nodes"]}
    conv = next(n for n in nodes.values() if n["op"] == "aten.convolution.default")
    assert "cortex_m::quantized_conv2d.out" in rows[conv["node"]]["kernel_ops"]
    linear = next(n for n in nodes.values() if n["op"] == "aten.linear.default")
    assert (
        rows[linear["node"]]["kernel_ops"][0] == "cortex_m::quantized_linear.out"
    )  # (+ its output dequantize)
    for row in prof["nodes"]:  # each row's instructions run the op the report says runs it
        for name in row["node"].split(", "):
            assert nodes[name]["debug_handle"] == row["debug_handle"]
    page = tmp_path / "p.html"
    r = run_cli("report", str(out), "--html", str(page))
    assert r.returncode == 0, r.stderr
    text = page.read_text()
    assert (
        f"emulator instructions: {rows[conv['node']]['instructions']:,} (QEMU -icount, not device cycles)"
        in text
    )
