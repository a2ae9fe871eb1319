"""The CMake lists the firmware build writes carry the user's source paths (their ExecuTorch,
CMSIS-NN and TFLM trees): each is one quoted argument that CMake reads back unchanged, whatever
quote, ``$``, ``;`` or backslash it holds, and a line break is refused with one line."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from etforge.codegen.cmake_runtime import render_lists
from etforge.core.common.errors import EtforgeError

AWKWARD = ['/src/my "tree"', "/src/${HOME}/x;y", "/src/back\\slash", "/src/plain"]


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_cmake_reads_every_path_back_unchanged(tmp_path: Path) -> None:
    lists = tmp_path / "lists.cmake"
    lists.write_text(render_lists({"SOURCES": AWKWARD}))
    script = tmp_path / "print.cmake"
    script.write_text(
        f'include("{lists.as_posix()}")\n'
        'foreach(item IN LISTS ETFORGE_RT_SOURCES)\n  message("[${item}]")\nendforeach()\n'
    )
    proc = subprocess.run(["cmake", "-P", str(script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert [line[1:-1] for line in proc.stderr.splitlines()] == AWKWARD


def test_a_line_break_in_a_path_is_one_error_naming_it() -> None:
    with pytest.raises(EtforgeError, match=r"^path '/src/a\\nb' has a line break; CMake cannot take it$"):
        render_lists({"SOURCES": ["/src/a\nb"]})
