"""core/ is a row of rooms with doors one way: each stage imports only from the stages before
it (``etforge.core.STAGES``), and core imports none of what is built on it (plugins, the CLI,
the API, the SDK). Walks every module of every subpackage; imports under ``TYPE_CHECKING``
are annotations only and are not counted."""

from __future__ import annotations

import ast
from pathlib import Path

from etforge.core import STAGES

from support import REPO

CORE = REPO / "core"
#: What is built on core: core never imports it, at module level or inside a function.
ABOVE = ("etforge.plugins", "etforge.cli", "etforge.api", "etforge.sdk", "etforge.runtime", "etforge.codegen")


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every ``etforge`` import outside ``if TYPE_CHECKING:`` blocks."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            base = node.module
            if base == "etforge.core":
                out += [(node.lineno, f"etforge.core.{a.name}") for a in node.names]
            else:
                out.append((node.lineno, base))
        elif isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            out.append((node.lineno, "relative"))
    return [(line, m) for line, m in out if m.startswith("etforge") or m == "relative"]


def _modules() -> list[tuple[str, Path]]:
    return [(p.relative_to(CORE).parts[0], p) for p in sorted(CORE.rglob("*.py")) if p.parent != CORE]


def test_every_module_lives_in_a_declared_stage() -> None:
    top = sorted(p.name for p in CORE.glob("*.py") if p.name != "__init__.py")
    assert not top, f"modules outside any stage package: {top}"
    packages = sorted(p.name for p in CORE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
    assert packages == sorted(STAGES), f"core packages {packages} != STAGES {sorted(STAGES)}"
    for stage in STAGES:
        doc = ast.get_docstring(ast.parse((CORE / stage / "__init__.py").read_text()))
        assert doc, f"core/{stage}/__init__.py: say what the stage is (its docstring is the door sign)"


def test_each_stage_imports_only_from_the_stages_before_it() -> None:
    rank = {s: i for i, s in enumerate(STAGES)}
    wrong = []
    for stage, path in _modules():
        for line, module in _imports(path):
            where = f"{path.relative_to(REPO)}:{line}"
            if module == "relative":
                wrong.append(f"{where}: a relative import (write etforge.core.<stage>.<module>)")
            elif module.startswith(ABOVE):
                wrong.append(f"{where}: imports {module}, which is built on core")
            elif module.startswith("etforge.core."):
                other = module.split(".")[2]
                if other not in rank:
                    wrong.append(f"{where}: imports {module}, not in a stage")
                elif rank[other] > rank[stage]:
                    wrong.append(f"{where}: {stage} imports {module} from a later stage ({other})")
    assert not wrong, "imports against the stage order:\n" + "\n".join(wrong)


def test_the_walk_sees_a_backward_import(tmp_path: Path) -> None:
    """The checker itself: a later-stage import is found, a TYPE_CHECKING one is not."""
    mod = tmp_path / "m.py"
    mod.write_text(
        "from typing import TYPE_CHECKING\n"
        "from etforge.core.build.report import x\n"
        "if TYPE_CHECKING:\n"
        "    from etforge.core.cache.store import y\n"
        "def f():\n"
        "    from etforge.core import batch\n"
    )
    assert _imports(mod) == [(2, "etforge.core.build.report"), (6, "etforge.core.batch")]
