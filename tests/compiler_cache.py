"""A compiler cache (ccache) for the suite's firmware builds, when ccache is installed.

The suite compiles the same ExecuTorch runtime, CMSIS-NN and TFLM sources in several CMake
build trees: the content-keyed firmware cache (``runtime/firmware/build.py``, one tree per
library key) and the CMake package examples (tests/test_cmake_package.py, a tree per
configuration). On a fresh CI machine every tree starts cold, so each would compile them again.
CMake takes ``CMAKE_<LANG>_COMPILER_LAUNCHER`` from the environment when it configures a new
tree; with ``ccache`` there, a source compiled with the same compile line and the same included
text is compiled once. ``CCACHE_BASEDIR`` (pytest's cache directory, above both kinds of tree)
makes the paths inside it relative to each compile's directory: the firmware cache's trees lay
out their generated include directories as the examples' do (build.py ``RUNTIME_GEN``) and use
the examples' toolchain flags, so one compile serves the firmware cache and every example.
ccache returns the object the compiler wrote for that command line; the one thing the base
directory changes in it is a header's ``__FILE__`` (flatbuffers' assert messages name
``etforge-gen/firmware/runtime/include/flatbuffers/vector.h`` instead of an absolute path, as
ccache's manual warns): the code, and what the tests check of the images, is the same. Variables already set win (a developer's own
ccache setup, or none: ``CMAKE_C_COMPILER_LAUNCHER=`` turns it off).

TFLM compiles with precompiled headers (cmake/etforge.cmake ``ETFORGE_TFLM_PCH``). ccache caches
a GCC PCH and the compiles that ``-include`` it only with ``sloppiness=pch_defines,time_macros``
(its manual, PRECOMPILED HEADERS: it cannot see ``__TIME__`` or a ``#define`` through a PCH;
no TFLM source uses either, and the compile line, which holds every define, is hashed as
always); without it each of those compiles bypasses the cache. Every such compile hashes the
~250 MB ``.gch``: ``inode_cache`` hashes each file once (0.3 -> 0.08 CPU s per cached TFLM object).
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
    os.environ.setdefault("CCACHE_SLOPPINESS", "pch_defines,time_macros")
    os.environ.setdefault("CCACHE_INODECACHE", "1")
    return True


def describe() -> str:
    """One line for pytest's header: how this session's firmware builds compile (told, since a
    cold run without a compiler cache compiles the shared sources once per build tree)."""
    launchers = {os.environ.get(f"CMAKE_{lang}_COMPILER_LAUNCHER", "") for lang in LANGS}
    if launchers == {""}:
        why = (
            "ccache is not on PATH"
            if shutil.which("ccache") is None
            else "CMAKE_<LANG>_COMPILER_LAUNCHER is empty"
        )
        return f"firmware builds: no compiler cache ({why}): each CMake tree compiles its sources itself (slower)"
    where = os.environ.get("CCACHE_DIR", "ccache's default directory")
    base = os.environ.get("CCACHE_BASEDIR", "none")
    return f"firmware builds: compiler launcher {' '.join(sorted(launchers))} (cache {where}, base {base})"
