"""Commands that need no model start without torch: usage and path errors, report, cache,
targets, plugins, and verify on a directory that holds no compile (issue 47). Checked by what
is imported (``sys.modules`` in a fresh interpreter), not by a wall-clock limit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

CODE = r"""
import json, sys
from click.testing import CliRunner
from etforge.cli import main

results = []
for args in json.loads(sys.argv[1]):
    r = CliRunner().invoke(main, args)
    results.append([args, r.exit_code, r.output[-300:]])
heavy = sorted(m for m in ("torch", "executorch", "torchao") if m in sys.modules)
print(json.dumps({"results": results, "heavy": heavy}))
"""


def _run(commands: list[list[str]], cwd: Path) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CODE, json.dumps(commands)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_errors_that_need_no_model_do_not_import_torch(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    commands = [
        ["verify", str(tmp_path / "empty")],  # a directory that holds no compile
        ["verify", str(tmp_path / "missing")],
        ["compile", str(tmp_path / "nofile.py") + ":build", "-t", "imxrt700", "-o", str(tmp_path / "o1")],
        ["compile", str(tmp_path / "nofile.pt2"), "-t", "imxrt700", "-o", str(tmp_path / "o2")],
        ["compile", "no_spec_form", "-t", "imxrt700", "-o", str(tmp_path / "o3")],
        ["report", str(tmp_path / "empty")],
        ["cache", "info"],
        ["targets"],
        ["plugins"],
    ]
    got = _run(commands, tmp_path)
    codes = {tuple(args[:2]): code for args, code, _ in got["results"]}
    assert all(code == 1 for args, code, _ in got["results"][:6]), got["results"]
    assert codes[("cache", "info")] == codes[("targets",)] == codes[("plugins",)] == 0, got["results"]
    text = "\n".join(out for _, _, out in got["results"])
    assert "no compiled program here" in text and "nofile.py does not exist" in text
    assert "nofile.pt2 does not exist" in text and "expected zoo:NAME" in text
    assert got["heavy"] == [], got["heavy"]
