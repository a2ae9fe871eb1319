"""Shared fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Every compile in the suite builds afresh (tests swap plugins, SDK doubles and fault hooks
# under one version); the build-cache tests turn the cache on explicitly.
os.environ.setdefault("ETFORGE_NO_CACHE", "1")


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    return tmp_path / "site"
