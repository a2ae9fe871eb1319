"""Memory on the RT700: CMSIS-NN scratch buffers planned with the rest, CPU/ISA options, budgets."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from etforge import zoo
from etforge.core.compiler import compile_model
from etforge.core.errors import EtforgeError
from etforge.core.memory import memory_stats

from support import run_cli


def _compile(options: dict[str, str], target: str = "cortex-m33") -> object:
    model, example = zoo.build("ds_cnn")
    return compile_model(model, example, target, calibration=zoo.calibration("ds_cnn", 2), options=options)


def _cmsis_sizes(result: object, isa: str) -> Counter[int]:
    """Scratch sizes CMSIS-NN's own size functions give for the lowered kernels."""
    from executorch.backends.cortex_m.library import cmsis_nn
    from executorch.backends.cortex_m.passes.scratch_buffer_sizes import required_cmsis_nn_buffer_sizes

    backend = getattr(cmsis_nn.Backend, isa.upper())
    sizes: Counter[int] = Counter()
    for node in result.host_program.graph.nodes:  # type: ignore[attr-defined]
        if node.op == "call_function":
            found = required_cmsis_nn_buffer_sizes(node, backend)
            sizes.update(found or [])
    return sizes


@pytest.mark.parametrize("isa", ["scalar", "mve"])
def test_scratch_buffers_are_planned_with_cmsis_nn_sizes(isa: str) -> None:
    result = _compile({"cpu": "cortex-m55", "isa": isa})
    stats = memory_stats(result.executorch)  # type: ignore[attr-defined]
    assert stats.scratch, "no CMSIS-NN scratch buffers in the planned program"
    assert Counter(s["bytes"] for s in stats.scratch) == _cmsis_sizes(result, isa)
    assert stats.lower_bound <= sum(stats.arena_bytes)


def test_changing_the_isa_changes_scratch_and_arena() -> None:
    scalar = memory_stats(_compile({"cpu": "cortex-m55", "isa": "scalar"}).executorch)  # type: ignore[attr-defined]
    mve = memory_stats(_compile({"cpu": "cortex-m55", "isa": "mve"}).executorch)  # type: ignore[attr-defined]
    assert sum(s["bytes"] for s in mve.scratch) > sum(s["bytes"] for s in scalar.scratch)
    assert sum(mve.arena_bytes) > sum(scalar.arena_bytes)


def test_isa_is_validated_against_the_core() -> None:
    with pytest.raises(EtforgeError, match="isa=mve on cpu=cortex-m33.*not supported on M33"):
        _compile({"isa": "mve"})


def test_memory_budget_names_the_peak(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_cli(
        "compile", "zoo:ds_cnn", "--target", "cortex-m33", "-o", str(out), "--memory-budget", "1000"
    )
    assert proc.returncode == 1
    assert "does not fit the memory budget 1,000 B" in proc.stderr and "peak live memory" in proc.stderr
    assert "cortex_m_" in proc.stderr  # the nodes alive at the peak
    assert not (out / "model.pte").exists()
