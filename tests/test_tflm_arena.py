"""The TFLM arena of a host-only partition, computed at compile time
(``plugins/targets/tflm_arena.py``), is carried in report.json beside the NPU working memory,
shown in the summary, and stated in etforge_model.h with where each partition runs. The device
holds the figure (``tests/test_firmware_tflm.py``: TFLM's used bytes fit in it)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from etforge.plugins.targets import tflm_arena


class _Two(torch.nn.Module):
    """conv (partition 0) -> flip (CPU) -> conv, pool, linear (partition 1)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.fc = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flip(torch.relu(self.c1(x)), [3])
        return self.fc(torch.nn.functional.adaptive_avg_pool2d(torch.relu(self.c2(x)), 1).flatten(1))


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    import etforge

    torch.manual_seed(0)
    calibration = [(torch.randn(1, 3, 16, 16),) for _ in range(4)]
    c = etforge.compile(_Two().eval(), calibration[0], target="imxrt700cm", calibration=calibration)
    out = c.save(tmp_path_factory.mktemp("arena") / "two")
    c.codegen(out / "codegen")
    return c, out


def test_greedy_planner_places_as_tflm() -> None:
    """Largest first, each at the lowest offset clear of the buffers alive with it: A (64 B,
    ops 0-1) at 0, C (48 B, ops 2-3, never alive with A) at 0, B (32 B, ops 1-2) above both."""
    assert tflm_arena._greedy([(64, 0, 1), (32, 1, 2), (48, 2, 3)]) == 96
    assert tflm_arena._greedy([(32, 0, 0), (32, 2, 2), (16, 0, 2)]) == 48


def test_report_carries_the_arena_beside_the_working_memory(compiled: tuple[object, Path]) -> None:
    c, out = compiled
    mem = c.report["memory"]  # type: ignore[attr-defined]
    parts = mem["npu_partitions"]
    assert len(parts) == 2 and mem["fallback_arena_source"] == tflm_arena.NOTE
    for p in parts:
        tflite = (out / "partitions" / f"{p['name']}.tflite").read_bytes()
        # at least the activations that are alive at once, far below the 1 MiB reserved before
        assert p["lower_bound_bytes"] <= p["fallback_arena_bytes"] == tflm_arena.arena_bytes(tflite) < 1 << 16
    assert "not NXP data" in tflm_arena.NOTE


def test_summary_shows_it(compiled: tuple[object, Path]) -> None:
    from etforge.core.build.summary import summary_lines

    c, _ = compiled
    report = c.report  # type: ignore[attr-defined]
    text = " ".join(" ".join(summary_lines(report, width=200)).split())
    sizes = ", ".join(
        f"{p['name']} {p['fallback_arena_bytes']:,} B" for p in report["memory"]["npu_partitions"]
    )
    assert f"in TFLM on the CPU instead: {sizes})" in text


def test_header_says_where_each_partition_runs(compiled: tuple[object, Path]) -> None:
    c, out = compiled
    header = (out / "codegen" / "etforge_model.h").read_text()
    parts = c.report["memory"]["npu_partitions"]  # type: ignore[attr-defined]
    for p in parts:
        line = next(ln for ln in header.splitlines() if ln.startswith(f"//   {p['name']}: "))
        assert "not on the NPU" in line and "ETFORGE_TFLM_PARTITIONS" in line
        assert f"TFLM arena of {p['fallback_arena_bytes']} bytes" in line
    m = re.search(r"kTflmArenaBytes\[2\] = \{ (\d+), (\d+) \};", header)
    assert m and [int(x) for x in m.groups()] == [p["fallback_arena_bytes"] for p in parts]
    first = header
    c.codegen(out / "codegen")  # type: ignore[attr-defined]
    assert (out / "codegen" / "etforge_model.h").read_text() == first  # deterministic
