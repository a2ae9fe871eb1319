"""docs/architecture.md names every module of every core stage and every runtime room, in its row."""

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


def test_every_runtime_module_is_in_its_room_row() -> None:
    from etforge.runtime import ROOMS

    text = (REPO / "docs" / "architecture.md").read_text()
    missing = []
    for room in ROOMS:
        row = re.search(rf"^\| `{room}` \| ([^|]+) \|", text, re.M)
        assert row, f"no row for runtime room {room}"
        listed = {m.strip() for m in row.group(1).split(",")}
        modules = {p.stem for p in (REPO / "runtime" / room).glob("*.py") if p.stem != "__init__"}
        missing += [f"runtime/{room}/{m}.py" for m in sorted(modules - listed)]
    assert not missing, f"docs/architecture.md does not list: {', '.join(missing)}"
