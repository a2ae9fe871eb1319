"""The code base stays ruff clean (lint and format)."""

from __future__ import annotations

import subprocess
import sys

from support import REPO


def test_ruff_check() -> None:
    proc = subprocess.run([sys.executable, "-m", "ruff", "check", str(REPO)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", str(REPO)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
