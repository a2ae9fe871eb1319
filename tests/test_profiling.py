"""Debug-handle maps from LiteRT ops back to Edge nodes (by construction), and the ETRecord."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from etforge.core.build import output
from etforge.core.build.report import build_report
from etforge.core.build.session import compile_model
from etforge.core.graph.utils import node_op
from etforge.core.registry.manager import registry


class Residual(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.c2 = torch.nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.c2(torch.relu(self.c1(x))))


class TwoPools(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(x, 2) + F.avg_pool2d(x, 2)


class ThreeBranches(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(3, 2, 1)
        self.b = torch.nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.a(x), self.b(x), F.max_pool2d(x, 3, 1, 1)], dim=1)


def _lowered(
    module: torch.nn.Module, shape: tuple[int, ...]
) -> tuple[object, dict[int, tuple[int, ...]], list[str]]:
    torch.manual_seed(0)
    x = (torch.randn(shape),)
    result = compile_model(module, x, "imxrt700", calibration=[x])
    assert len(result.partitions) == 1 and all(d.npu for d in result.decisions)
    graph = result.host_program.graph_module
    lowered = next(
        getattr(graph, n.target) for n in graph.graph.nodes if n.op == "get_attr" and "lowered" in n.target
    )
    debug_map = {int(k): tuple(v) for k, v in lowered.meta["debug_handle_map"].items()}
    return result, debug_map, result.partitions[0].converted.operators


def _ops_of(result: object, debug_map: dict[int, tuple[int, ...]], ops: list[str]) -> dict[str, list[str]]:
    """Edge op -> the LiteRT builtins whose map names its node's debug handle."""
    by_handle: dict[int, list[str]] = defaultdict(list)
    for index, handles in debug_map.items():
        for h in handles:
            by_handle[h].append(ops[index])
    out: dict[str, list[str]] = defaultdict(list)
    for d in result.decisions:  # type: ignore[attr-defined]
        out[d.op] += sorted(by_handle.get(d.handle, []))
    return out


def _every_op_maps_to_an_edge_node(
    result: object, debug_map: dict[int, tuple[int, ...]], ops: list[str]
) -> None:
    graph = result.host_program.graph_module  # type: ignore[attr-defined]
    lowered = next(
        getattr(graph, n.target) for n in graph.graph.nodes if n.op == "get_attr" and "lowered" in n.target
    )
    handles = {n.meta.get("debug_handle") for n in lowered.original_module.graph.nodes} - {None}
    assert set(debug_map) == set(range(len(ops)))
    for index, hs in debug_map.items():
        assert hs and set(hs) <= handles, (index, ops[index], hs)


def test_residual_block_maps_exactly() -> None:
    result, debug_map, ops = _lowered(Residual(), (1, 4, 6, 6))
    per_op = _ops_of(result, debug_map, ops)
    convs = [d for d in result.decisions if d.op == "aten.convolution.default"]
    assert len(convs) == 2
    assert per_op["aten.convolution.default"].count("CONV_2D") == 2
    # the add, with its relu fused into it (plus, last in the graph, the output's NHWC->NCHW transpose)
    assert [o for o in per_op["aten.add.Tensor"] if o != "TRANSPOSE"] == ["ADD"]
    assert sorted(o for o in per_op["aten.relu.default"] if o != "TRANSPOSE") == ["ADD", "CONV_2D"]
    assert ops.count("CONV_2D") == 2 and ops.count("ADD") == 1
    _every_op_maps_to_an_edge_node(result, debug_map, ops)


def test_two_pools_reading_one_tensor_map_to_their_own_ops() -> None:
    result, debug_map, ops = _lowered(TwoPools(), (1, 3, 4, 4))
    per_op = _ops_of(result, debug_map, ops)
    pool = per_op["aten.max_pool2d_with_indices.default"] or per_op["aten.max_pool2d.default"]
    assert "MAX_POOL_2D" in pool and "AVERAGE_POOL_2D" not in pool
    assert (
        "AVERAGE_POOL_2D" in per_op["aten.avg_pool2d.default"]
        and "MAX_POOL_2D" not in per_op["aten.avg_pool2d.default"]
    )
    assert ops.count("TRANSPOSE") == 2  # one NCHW->NHWC shared by both pools, one back at the output
    _every_op_maps_to_an_edge_node(result, debug_map, ops)


def test_concat_of_three_branches() -> None:
    result, debug_map, ops = _lowered(ThreeBranches(), (1, 3, 5, 5))
    per_op = _ops_of(result, debug_map, ops)
    assert per_op["aten.convolution.default"].count("CONV_2D") == 2
    assert per_op["aten.cat.default"].count("CONCATENATION") == 1
    assert ops.count("CONCATENATION") == 1 and ops.count("MAX_POOL_2D") == 1
    _every_op_maps_to_an_edge_node(result, debug_map, ops)


def test_report_ops_and_etrecord(tmp_path: Path) -> None:
    from executorch.devtools.etrecord import parse_etrecord

    reg = registry()
    torch.manual_seed(0)
    x = (torch.randn(1, 4, 6, 6),)
    result = compile_model(Residual(), x, "imxrt700cm", calibration=[x], reg=reg)
    report = build_report(result, reg, "residual")
    output.write_outputs(tmp_path, result, report)
    output.write_etrecord(tmp_path, result)
    for node in report["nodes"]:
        assert node["placement"] == "npu" and node["litert_ops"], node
    etrecord = parse_etrecord(str(tmp_path / output.ETRECORD))
    delegates = [d for method in etrecord._delegate_map.values() for d in method.values()]
    assert [d["name"] for d in delegates] == ["EtforgeNpuBackend"]
    recorded = {int(k): tuple(v) for k, v in delegates[0]["delegate_map"].items()}
    expected = {k: tuple(v) for k, v in result.partitions[0].converted.debug_map.items()}
    assert recorded == expected
    # the Edge program the Inspector maps CPU rows through holds the delegate call, once
    edge_ops = [node_op(n) for n in etrecord.edge_dialect_program.graph.nodes if n.op == "call_function"]
    assert edge_ops.count("executorch_call_delegate") == 1, edge_ops


@pytest.mark.parametrize("module", [Residual()])
def test_debug_map_survives_into_the_pte_lowered_module(module: torch.nn.Module) -> None:
    result, debug_map, ops = _lowered(module, (1, 4, 6, 6))
    assert debug_map == {k: tuple(v) for k, v in result.partitions[0].converted.debug_map.items()}
