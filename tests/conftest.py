"""Shared fixtures."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    return tmp_path / "site"
