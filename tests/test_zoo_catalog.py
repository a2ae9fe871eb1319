"""The zoo's torch-free catalog is the zoo (``etforge zoo`` lists it; ``compile zoo:NAME``
refuses an unknown name from it before torch loads, issue 47)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from etforge.zoo.catalog import CATALOG


def test_catalog_lists_exactly_the_zoo_models_with_their_inputs() -> None:
    from etforge import zoo

    assert {m.name: (m.input_shape, m.description) for m in CATALOG} == {
        name: (tuple(e.input_shape), e.description) for name, e in zoo.ZOO.items()
    }
    assert {m.name for m in CATALOG if m.trained} == {
        n for n, e in zoo.ZOO.items() if e.calibrate is not None
    }


CODE = r"""
import json, sys
from click.testing import CliRunner
from etforge.cli import main

r = CliRunner().invoke(main, ["compile", "zoo:nonet", "-t", "cortex-m33", "-o", sys.argv[1]])
print(json.dumps({"code": r.exit_code, "output": r.output, "torch": "torch" in sys.modules}))
"""


@pytest.mark.slow  # a fresh interpreter
def test_unknown_zoo_name_is_one_error_without_torch(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", CODE, str(tmp_path / "out")], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["code"] == 1 and not got["torch"], got
    lines = [line for line in got["output"].splitlines() if line.strip()]
    assert len(lines) == 1 and "unknown zoo model 'nonet'" in lines[0] and "cifarnet" in lines[0], lines
    assert not (tmp_path / "out").exists()
