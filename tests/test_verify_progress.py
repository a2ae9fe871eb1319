"""``etforge verify`` says what it is doing (issue 47): each step with what it compared and its
seconds, then the verdict first, the gates, and the figures labelled as not gated."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from support import run_cli

pytestmark = pytest.mark.slow

MODEL = """
import torch


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(), torch.nn.Linear(8, 4),
    ).eval()
    g = torch.Generator().manual_seed(1)
    return model, (torch.randn(1, 3, 8, 8, generator=g),), [(torch.randn(1, 3, 8, 8, generator=g),) for _ in range(4)]
"""


def test_verify_reports_each_step_then_the_verdict_gates_and_figures(tmp_path: Path) -> None:
    model = tmp_path / "net.py"
    model.write_text(MODEL)
    out = tmp_path / "out"
    built = run_cli("compile", f"{model}:build", "--target", "imxrt700cm", "-o", str(out), "--no-cache")
    assert built.returncode == 0, built.stderr
    proc = run_cli("verify", str(out), "--samples", "2", "--min-top1", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    steps = ["hash chain:", "loaded the lowered program the compile saved", "payload bytes:", "ran 2 samples", "float check:",
             "model.pte (host interpreter, planned offsets)"]  # fmt: skip
    at = [next(i for i, ln in enumerate(lines) if ln.strip().startswith(s)) for s in steps]
    assert at == sorted(at), lines
    assert all(re.search(r"\(\d+\.\d s\)$", lines[i]) for i in at), lines
    verdict = next(i for i, ln in enumerate(lines) if ln.startswith("verify passed: "))
    titles = [ln.strip() for ln in lines]  # a table's title is centred over it
    gates = titles.index("gates (each must hold; docs/report.md)")
    figures = titles.index("figures (reported, not gated)")
    assert max(at) < verdict < gates < figures, lines
    below = "\n".join(lines[figures:])
    assert "max |ours - quantized ref in float32| (steps)" in below and "top-1 vs float model" in below
    assert lines[-1] == "verify passed"
    as_json = run_cli("verify", str(out), "--samples", "2", "--min-top1", "0", "--json")
    data = json.loads(as_json.stdout)  # no progress on stdout
    assert {"files", "rebuild", "float check", "pte"} <= set(data["seconds"]) and data["ok"]
