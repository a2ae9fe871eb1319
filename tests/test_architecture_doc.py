"""docs/architecture.md names every module of every core stage, in that stage's row."""

from __future__ import annotations

import re

from etforge.core import STAGES

from support import REPO


def test_every_core_module_is_in_its_stage_row() -> None:
    text = (REPO / "docs" / "architecture.md").read_text()
    missing = []
    for stage in STAGES:
        row = re.search(rf"^\| `{stage}` \| ([^|]+) \|", text, re.M)
        assert row, f"no row for stage {stage}"
        listed = {m.strip() for m in row.group(1).split(",")}
        modules = {p.stem for p in (REPO / "core" / stage).glob("*.py") if p.stem != "__init__"}
        missing += [f"core/{stage}/{m}.py" for m in sorted(modules - listed)]
    assert not missing, f"docs/architecture.md does not list: {', '.join(missing)}"
