"""tests/shared_outputs.py: a copy of a session's compile is what the compile would have written.

The output used is one the firmware files share anyway (``zoo:digits_cnn`` for cortex-m33), so
in a whole run this file compiles nothing of its own.
"""

from __future__ import annotations

from pathlib import Path

import shared_outputs
from shared_outputs import compile_once

from etforge.runtime.firmware.tflm import same_tree

ARGS = ("zoo:digits_cnn", "--target", "cortex-m33")


def test_a_shared_output_names_no_directory_and_each_test_gets_its_own_copy(tmp_path: Path) -> None:
    """No file the compile wrote names the directory it was written to (a copy elsewhere would
    then point at the first test's files); each caller gets a full copy of its own, and the
    command's messages name the caller's directory."""
    first, second = tmp_path / "first", tmp_path / "second"
    a = compile_once(*ARGS, out=first)
    b = compile_once(*ARGS, out=second)
    assert a.returncode == b.returncode == 0, a.stdout + a.stderr
    root = shared_outputs.ROOT[0]
    assert root is not None
    (kept,) = [p.parent for p in root.glob("*/proc.json") if same_tree(p.parent / "out", first)]
    named = [
        str(f.relative_to(kept))
        for f in (kept / "out").rglob("*")
        if f.is_file() and any(str(d).encode() in f.read_bytes() for d in (kept, root, root.parent))
    ]
    assert named == []
    assert same_tree(first, second) and not first.samefile(second)
    assert str(kept) not in a.stdout + b.stdout and str(second) in b.args
    (first / "model.pte").write_bytes(b"changed")  # a test may change its copy ...
    assert (second / "model.pte").read_bytes() != b"changed"  # ... and no other test sees it


def test_a_failed_compile_is_not_kept(tmp_path: Path) -> None:
    root = shared_outputs.ROOT[0]
    assert root is not None
    before = sorted(root.glob("*/proc.json")) if root.is_dir() else []
    proc = compile_once("zoo:no_such_model", "--target", "cortex-m33", out=tmp_path / "o")
    assert proc.returncode != 0
    assert sorted(root.glob("*/proc.json")) == before and not (tmp_path / "o").exists()
