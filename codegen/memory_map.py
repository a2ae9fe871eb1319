"""The firmware's memory, buffer by buffer, and whether it fits a board's regions.

``firmware_buffers`` lists what a firmware built with the CMake package (``etforge_add_model``
and the C API) holds for one program: the ``.pte`` (constants and delegate payloads inside
it), each planned arena by memory id (CMSIS-NN scratch is planned inside them), the NPU/TFLM
working memory, ExecuTorch's method and temp pools, and a stack estimate -- each with its
bytes, the section it lands in and whether the figure is exact, an estimate or assumed.
``report.json`` carries the list (``memory.firmware_buffers``).

``--memory-map FILE.toml`` names the board's regions, their sizes and which kinds of buffer
each holds (docs/firmware.md); ``check_fit`` fails naming the first buffer that does not fit.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from etforge.codegen import c_api
from etforge.core.common.errors import EtforgeError

#: *Assumed* stack for ExecuTorch's ``execute`` with CMSIS-NN kernels (no NXP figure, no
#: measurement on the device): the examples' linker scripts reserve it.
STACK_BYTES = 8192
#: Kinds of buffer a region can hold.
KINDS = ("program", "arena", "npu", "pools", "stack")
_SIZE = re.compile(r"(?i)\s*(0x[0-9a-f]+|\d+)\s*([kmg]i?b?|b)?\s*")
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def firmware_buffers(
    pte: Path, report: dict[str, Any], sections: c_api.Sections | None = None
) -> list[dict[str, Any]]:
    """Every buffer of the firmware, in the order a region fills (default sections unless given)."""
    sections = sections or c_api.Sections()
    memory = report.get("memory", {})
    sizes = c_api.buffers(pte, report)
    out = [
        {
            "buffer": f"program .pte (constants {memory.get('constant_bytes', 0):,} B, "
            f"delegate payloads {memory.get('delegate_bytes', 0):,} B)",
            "kind": "program",
            "bytes": sizes["pte_bytes"],
            "section": sections.pte,
            "basis": "exact",
        }
    ]
    scratch = sum(x.get("bytes", 0) for x in memory.get("scratch", []))
    for i, n in enumerate(sizes["arenas"], start=1):
        out.append(
            {
                "buffer": f"arena memory id {i}",
                "kind": "arena",
                "bytes": n,
                "section": sections.arena,
                "basis": "exact",
            }
        )
    if scratch:  # ExecuTorch plans the CMSIS-NN scratch buffers: counted in the arenas above
        out.append(
            {
                "buffer": f"CMSIS-NN scratch ({len(memory.get('scratch', []))} kernel buffers)",
                "kind": "arena",
                "bytes": scratch,
                "section": sections.arena,
                "basis": "exact",
                "inside": "the planned arenas",
            }
        )
    if sizes["npu_working"]:
        out.append(
            {
                "buffer": "NPU working memory (largest partition)",
                "kind": "npu",
                "bytes": sizes["npu_working"],
                "section": sections.npu,
                "basis": "estimate" if "estimate" in str(memory.get("npu_source", "")) else "exact",
            }
        )
    out += [
        {
            "buffer": "ExecuTorch method pool",
            "kind": "pools",
            "bytes": sizes["method_pool"],
            "section": sections.arena,
            "basis": "estimate",
        },
        {
            "buffer": "ExecuTorch temp pool",
            "kind": "pools",
            "bytes": sizes["temp_pool"],
            "section": sections.arena,
            "basis": "assumed",
        },
        {"buffer": "stack", "kind": "stack", "bytes": STACK_BYTES, "section": "(stack)", "basis": "assumed"},
    ]
    return out


def _size(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str) and (m := _SIZE.fullmatch(value)):
        unit = (m.group(2) or "").lower().rstrip("b").rstrip("i") or ""
        n = int(m.group(1), 0) * _UNITS[unit]
        if n > 0:
            return n
    raise EtforgeError(
        f'{where}: size {value!r} is not a positive byte count (e.g. 1572864, "1536K", "0x180000")'
    )


def load_memory_map(path: Path) -> dict[str, dict[str, Any]]:
    """``{region: {"size": bytes, "holds": [kinds]}}`` from ``path``; one error naming what is wrong."""
    import tomllib

    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise EtforgeError(f"memory map {path}: cannot read it ({exc.strerror})") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise EtforgeError(f"memory map {path}: not valid TOML: {exc}") from None
    if not data:
        raise EtforgeError(f"memory map {path}: no regions (tables like [sram] with size and holds)")
    regions: dict[str, dict[str, Any]] = {}
    held: dict[str, str] = {}
    for name, table in data.items():
        where = f"memory map {path}: region {name}"
        if not isinstance(table, dict):
            raise EtforgeError(f"{where}: expected a table with size and holds")
        unknown = set(table) - {"size", "holds"}
        if unknown or "size" not in table or "holds" not in table:
            raise EtforgeError(
                f"{where}: needs exactly 'size' and 'holds' (got {', '.join(sorted(table)) or 'nothing'})"
            )
        holds = table["holds"]
        if not isinstance(holds, list) or not all(isinstance(k, str) for k in holds):
            raise EtforgeError(f"{where}: holds must be a list of {', '.join(KINDS)}")
        for kind in holds:
            if kind not in KINDS:
                raise EtforgeError(f"{where}: unknown buffer kind {kind!r} (known: {', '.join(KINDS)})")
            if kind in held:
                raise EtforgeError(f"{where}: {kind!r} is already held by region {held[kind]}")
            held[kind] = name
        regions[name] = {"size": _size(table["size"], where), "holds": list(holds)}
    return regions


def check_fit(
    buffers: list[dict[str, Any]], regions: dict[str, dict[str, Any]], path: Path
) -> list[dict[str, Any]]:
    """Each region's use (``{"region", "size", "used"}``); an error naming the first buffer
    that does not fit, or a kind no region holds."""
    where = {kind: name for name, r in regions.items() for kind in r["holds"]}
    for b in buffers:
        if b["kind"] not in where:
            raise EtforgeError(
                f"memory map {path}: no region holds {b['kind']!r} buffers ({b['buffer']}, {b['bytes']:,} B)"
            )
    used = dict.fromkeys(regions, 0)
    for b in buffers:
        if b.get("inside"):  # already counted in the buffer holding it
            continue
        region = where[b["kind"]]
        size = regions[region]["size"]
        if used[region] + b["bytes"] > size:
            raise EtforgeError(
                f"{b['buffer']} ({b['bytes']:,} B, {b['basis']}) does not fit region {region} of {path}: "
                f"{size:,} B, {used[region]:,} B already taken by the buffers before it"
            )
        used[region] += b["bytes"]
    return [{"region": n, "size": r["size"], "used": used[n]} for n, r in regions.items()]
