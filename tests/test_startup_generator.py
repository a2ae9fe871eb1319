"""The command line's start-up leaves the firmware generator unimported (issue 47): ``etforge
codegen``'s package init imports jinja2 and PyYAML, which only ``codegen``, a firmware build
and ``cmake-dir`` read. Checked by what a fresh interpreter imports, not by a clock."""

from __future__ import annotations

import json
import subprocess
import sys

from etforge.codegen.cmake_runtime import cmake_dir

CODE = r"""
import json, sys
import etforge.cli
before = sorted(m for m in ("jinja2", "yaml", "etforge.codegen") if m in sys.modules)
from click.testing import CliRunner
r = CliRunner().invoke(etforge.cli.main, ["cmake-dir"])
print(json.dumps({"before": before, "code": r.exit_code, "out": r.output.strip()}))
"""


def test_cli_start_up_leaves_the_generator_unimported_and_cmake_dir_answers() -> None:
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["before"] == [], got
    assert got["code"] == 0 and got["out"] == str(cmake_dir()), got
