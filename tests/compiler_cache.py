"""A compiler cache (ccache) for the suite's firmware builds, when ccache is installed.

The suite compiles the same ExecuTorch runtime, CMSIS-NN and TFLM sources in several CMake
build trees: the content-keyed firmware cache (``runtime/firmware/build.py``, one tree per
library key) and the CMake package examples (tests/test_cmake_package.py, a tree per
configuration). On a fresh CI machine every tree starts cold, so each would compile them again.
CMake takes ``CMAKE_<LANG>_COMPILER_LAUNCHER`` from the environment when it configures a new
tree; with ``ccache`` there, a source compiled with the same flags and the same preprocessed
text is compiled once. ``CCACHE_BASEDIR`` (pytest's cache directory) makes paths inside it
relative, so trees of the same layout under different names (the examples' two trees) share
their objects too. ccache returns the object the compiler wrote, byte for byte: the images and
what the tests check of them are the same with or without it. Variables already set win (a
developer's own ccache setup, or none: ``CMAKE_C_COMPILER_LAUNCHER=`` turns it off).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

LANGS = ("C", "CXX")


def use_ccache(cache_dir: Path, base: Path) -> bool:
    """Point CMake's compiler launchers at ccache (objects in ``cache_dir``, paths under
    ``base`` hashed relative); False (nothing set) when ccache is not on PATH."""
    exe = shutil.which("ccache")
    if exe is None:
        return False
    for lang in LANGS:
        os.environ.setdefault(f"CMAKE_{lang}_COMPILER_LAUNCHER", exe)
    os.environ.setdefault("CCACHE_DIR", str(cache_dir))
    os.environ.setdefault("CCACHE_BASEDIR", str(base))
    return True
