"""NPU partitions' working memory: a valid offset plan over their LiteRT tensors, in the report,
the memory budget and the generated header."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from etforge.core.common.errors import EtforgeError
from etforge.core.litert.builder import LiteRTBuilder
from etforge.core.serialize.npu_memory import ESTIMATE, plan_partition


def _chain() -> bytes:
    """x -> RELU -> a -> ADD(a, w) -> b -> RELU -> y; every tensor float32[1, 256] (1,024 B),
    w a constant."""
    b = LiteRTBuilder()
    x, a, t, y = (b.add_tensor((1, 256), "float32", n) for n in ("x", "a", "b", "y"))
    w = b.add_tensor((1, 256), "float32", "w", data=np.ones((1, 256), np.float32))
    b.add_operator("RELU", [x], [a])
    b.add_operator("ADD", [a, w], [t])
    b.add_operator("RELU", [t], [y])
    b.inputs, b.outputs = [x], [y]
    return b.finish()


def _overlapping(tensors: list[Any]) -> list[tuple[str, str]]:
    found = []
    for i, p in enumerate(tensors):
        for q in tensors[i + 1 :]:
            alive = not (p.lifetime[1] < q.lifetime[0] or q.lifetime[1] < p.lifetime[0])
            apart = p.offset + p.allocated_memory <= q.offset or q.offset + q.allocated_memory <= p.offset
            if alive and not apart:
                found.append((p.name, q.name))
    return found


def test_a_chain_is_planned_at_its_peak() -> None:
    """By hand: x and y live for the whole call; at the ADD, x, a, b and y are alive: 4,096 B.
    The constant is in flash, not planned."""
    plan = plan_partition("chain", _chain())
    assert sorted(t.name for t in plan.tensors) == ["a", "b", "x", "y"]
    assert plan.lower_bound == 4096
    assert plan.working_bytes == 4096
    assert not _overlapping(plan.tensors)


def _peak_live(model: bytes) -> int:
    """The peak of bytes alive at once, from the LiteRT interpreter's own view of the graph
    (op inputs/outputs, tensor shapes and dtypes): constants are the inputs no op produces
    that are not graph inputs."""
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_content=model)
    details = {d["index"]: d for d in it.get_tensor_details()}
    ops = it._get_ops_details()
    graph_io = {d["index"] for d in it.get_input_details()} | {d["index"] for d in it.get_output_details()}
    produced = {t for op in ops for t in op["outputs"]}
    span: dict[int, list[int]] = {}
    for i, op in enumerate(ops):
        for t in [*op["inputs"], *op["outputs"]]:
            if t >= 0 and (t in produced or t in graph_io):
                span.setdefault(t, [i, i])[1] = i
    for t in graph_io:
        span[t] = [0, len(ops) - 1]

    def size(t: int) -> int:
        d = details[t]
        return int(np.prod(d["shape"])) * np.dtype(d["dtype"]).itemsize

    return max(sum(size(t) for t, (s, e) in span.items() if s <= i <= e) for i in range(len(ops)))


@pytest.fixture(scope="module")
def compiled() -> Any:
    from etforge.core.build.report import build_report
    from etforge.core.build.session import compile_model
    from etforge.core.registry.manager import registry

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 8, 1),
    ).eval()  # fmt: skip
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(1, 3, 16, 16, generator=g),) for _ in range(4)]
    reg = registry()
    result = compile_model(model, calib[0], "imxrt700", calibration=calib, reg=reg)
    return result, build_report(result, reg, "three_convs")


def test_partition_plan_is_valid_and_above_the_peak(compiled: Any) -> None:
    result, report = compiled
    assert result.partitions
    for part in result.partitions:
        plan = plan_partition(part.name, part.converted.tflite)
        assert not _overlapping(plan.tensors)
        peak = _peak_live(part.converted.tflite)
        assert plan.lower_bound == peak
        assert plan.working_bytes >= peak
        # three convs on 16x16: the int8 activations alone are 3*256 + 16*256 + 16*256 + 8*256 B
        assert plan.working_bytes < 3 * 256 + 16 * 256 + 16 * 256 + 8 * 256 + 4 * 16
    mem = report["memory"]
    assert [p["name"] for p in mem["npu_partitions"]] == [p.name for p in result.partitions]
    # the estimate, then what the NPU compiler plugin says the device figure is
    assert mem["npu_source"].startswith(ESTIMATE + "; ") and "NPU compiler" in mem["npu_source"]


def test_memory_budget_names_the_partition(compiled: Any) -> None:
    from etforge.core.serialize.memory import check_budget, memory_stats
    from etforge.core.serialize.npu_memory import plan_result

    result, _ = compiled
    stats, plans = memory_stats(result.executorch), plan_result(result)
    need = sum(stats.arena_bytes) + max(p.working_bytes for p in plans)
    check_budget(stats, need, plans)  # fits exactly
    with pytest.raises(EtforgeError) as err:
        check_budget(stats, need - 1, plans)
    message = str(err.value)
    assert f"NPU partition {plans[0].name}" in message and f"{need:,} B" in message
    assert "\n" not in message
    check_budget(stats, need - 1)  # the arena alone fits: only the NPU part is over


def test_header_carries_the_npu_working_memory(compiled: Any, tmp_path: Path) -> None:
    from etforge.codegen import generate

    result, report = compiled
    (tmp_path / "model.pte").write_bytes(result.pte)
    generate(tmp_path / "model.pte", tmp_path / "gen", report=report)
    header = next((tmp_path / "gen").glob("*.h")).read_text()
    sizes = ", ".join(str(p["working_bytes"]) for p in report["memory"]["npu_partitions"])
    assert f"kNpuWorkingBytes[{len(report['memory']['npu_partitions'])}] = {{ {sizes} }}" in header
    assert "the device figure comes from the NPU compiler" in header
