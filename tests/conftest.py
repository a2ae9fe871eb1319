"""Shared fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Every compile in the suite builds afresh (tests swap plugins, SDK doubles and fault hooks
# under one version); the build-cache tests turn the cache on explicitly.
os.environ.setdefault("ETFORGE_NO_CACHE", "1")


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    """Accept pyproject's ``-n 2 --dist loadfile`` when pytest-xdist is off (``-p no:xdist``)."""
    if pluginmanager.hasplugin("xdist"):
        return
    group = parser.getgroup("xdist", "pytest-xdist is not loaded: -n and --dist are ignored")
    # "-n" is a lowercase short option, which pytest reserves for itself and xdist.
    group._addoption("-n", "--numprocesses", dest="numprocesses", default=None, help="ignored")
    group.addoption("--dist", dest="dist", default="no", help="ignored")


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    return tmp_path / "site"
