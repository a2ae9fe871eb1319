"""The order test files start in: the longest first, so the workers finish together.

pytest-xdist's ``--dist loadfile`` hands out whole files in collection order (with
``--no-loadscope-reorder``; its default orders them by test count, which put files of a few
minute-long tests -- a dozen-model batch, a firmware build -- last, and one worker ran on alone
for minutes after the other ran out of work). Longest-first is the classic remedy for that
tail. :data:`HEAVY` lists the files whose tests take minutes, longest first (the durations
tables of CI runs); every other file follows, most tests first (xdist's own order). A stale
entry only costs speed, never a result; a name no file has is ignored.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

#: Files whose tests take minutes on CI (``--durations``), longest first. test_fallbacks.py
#: (~70 compiles, 67 CPU s cold) and test_firmware_npu.py (60) joined from stop 58's CPU table
#: (tests/cpu_table.py): placed by their test count, either could start late and run on alone.
HEAVY = (
    "test_cmake_package.py",
    "test_neutron_differential.py",
    "test_firmware_tflm.py",
    "test_cache_sound.py",
    "test_batch.py",
    "test_realworld.py",
    "test_device_conformance.py",
    "test_fallbacks.py",
    "test_firmware_npu.py",
    "test_firmware.py",
    "test_docs.py",
    "test_firmware_torchvision.py",
    "test_api.py",
    "test_packaging.py",
    "test_cache.py",
    "test_neutron_parity.py",
    "test_no_cache.py",
    "test_recurrent.py",
    "test_idiom.py",
)


def longest_first(items: list[Any]) -> None:
    """Reorder ``items`` in place by file: :data:`HEAVY` first, then by test count (most
    first), then by name; a file's own tests keep their order (its fixtures rely on it)."""
    count = Counter(item.path.name for item in items)
    rank = {name: i for i, name in enumerate(HEAVY)}

    def key(item: Any) -> tuple[int, int, str]:
        name = item.path.name
        return (rank.get(name, len(HEAVY)), -count[name] if name not in rank else 0, str(item.path))

    items.sort(key=key)  # stable: each file's tests stay in collection order
