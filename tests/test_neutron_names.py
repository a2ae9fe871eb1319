"""Neutron's NPU names have one source, ``DECLARES`` in plugins/targets/neutron.py: the table
in docs/writing-a-target-plugin.md is held to it row by row (name, kind, i.MX RT700 value,
meaning), and every name the built-in converters read is declared."""

from __future__ import annotations

import re

from etforge.plugins.targets.neutron import DECLARES, NEUTRON_C

from support import REPO

TABLE_DOC = REPO / "docs" / "writing-a-target-plugin.md"
ROW = re.compile(r"^\| `(\w+)` \| (limit|choice|flag) \| ([^|]+) \| ([^|]+) \|$", re.M)


def _kind_and_value(name: str) -> tuple[str, str] | None:
    """The row's kind and value for the i.MX RT700 (None: the spec leaves the name unset)."""
    if name in NEUTRON_C.limits:
        return "limit", str(NEUTRON_C.limits[name])
    if name in NEUTRON_C.choices:
        return "choice", ", ".join(str(v) for v in NEUTRON_C.choices[name])
    if name in NEUTRON_C.requires:
        return "flag", "set"
    return None


def _expected_row(name: str, kind: str | None = None) -> str:
    got = _kind_and_value(name)
    kind, value = got if got is not None else (kind or "limit", "unset")
    return f"| `{name}` | {kind} | {value} | {DECLARES[name]} |"


def test_the_target_plugin_table_is_the_declared_names() -> None:
    rows = {m.group(1): m for m in ROW.finditer(TABLE_DOC.read_text())}
    expected = "\n".join(_expected_row(n, rows[n].group(2) if n in rows else None) for n in DECLARES)
    assert list(rows) == list(DECLARES), f"the table's names are not DECLARES' (in order); want:\n{expected}"
    for name, m in rows.items():
        kind, value, meaning = m.group(2), m.group(3).strip(), m.group(4).strip()
        got = _kind_and_value(name)
        if got is None:  # unset on the RT700: "unset", optionally with the readers' default
            assert re.fullmatch(r"unset( \(.+\))?", value), (name, value)
        else:
            assert (kind, value) == got, (
                f"{name}: table says {kind} {value}, the spec {got}; want:\n{expected}"
            )
        assert meaning == DECLARES[name], f"{name}: table says {meaning!r}, DECLARES {DECLARES[name]!r}"


def test_every_name_a_builtin_converter_reads_is_declared() -> None:
    from etforge.core.registry.manager import registry

    read = {name: c.name for c in registry().converters for name in c.reads}
    assert read and set(read) <= set(DECLARES), sorted(set(read) - set(DECLARES))
