"""Neutron partition-level parity: the partitioning results ExecuTorch's NXP backend refuses.

Upstream validates each proposed partitioning (``neutron_partitioner.py``
``validate_partitioning_result`` and the converters' ``supports_partitioning_result``): a
partition whose every op is a no-op on Neutron (a view, a clone, a static or size-1-only
permute, a scale-1 resize, a keepdim mean over size-1 dims, a clamp / ReLU that the int8
range collapses, x + 0 ...) would compile to an empty Neutron graph, so it stays on the CPU;
a clone at a partition boundary must see a contiguous or channels-last tensor. Each case is
one node just inside or just outside one condition, decided by the production path (real
quantizer, ``pipeline.lower`` on both lowering paths up to ``EtforgePartitioner.partition``:
``test_neutron_parity.decide``), one small graph per case; the
``litert`` target, which has no such requirement, keeps delegating no-op partitions.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from test_neutron_parity import ACCEPTED, PATHS, TARGET, Case, decide
from torch.fx import Node

from etforge.core.graph.utils import is_dequantize
from etforge.core.lower.partitioner import Decision

NOOP = "partition of no-op ops only"
DIM_ORDER = "neither contiguous nor channels-last"


def _boundary_dim_order(order: tuple[int, ...]) -> Callable[[Node], None]:
    """The clone's input (a partition input) laid out in memory in ``order``."""

    def mutate(node: Node) -> None:
        dq = node.args[0]
        assert isinstance(dq, Node) and is_dequantize(dq)
        val = dq.meta["val"]
        shape = tuple(val.shape)
        stored = torch.empty([shape[d] for d in order], dtype=val.dtype)
        dq.meta["val"] = stored.permute([order.index(i) for i in range(len(order))])
        assert tuple(dq.meta["val"].shape) == shape

    return mutate


class _Const(torch.nn.Module):
    """A compile-time tensor of one value (a buffer, lifted as a constant by export)."""

    def __init__(self, value: float) -> None:
        super().__init__()
        self.register_buffer("value", torch.full((1, 2, 3, 4), value))


CASES: list[Case] = [
    # -- permute: a no-op when it only moves size-1 dims or its input is a constant ---------
    Case("permute-real-alone", "aten.permute_copy.default", ((1, 2, 3, 4),),
         lambda m, x: x.permute(0, 2, 3, 1), ACCEPTED),
    Case("permute-size1-alone", "aten.permute_copy.default", ((1, 1, 3, 4),),
         lambda m, x: x.permute(1, 0, 2, 3), NOOP),
    Case("permute-size1-next-to-conv", "aten.permute_copy.default", ((1, 1, 3, 4),),
         lambda m, x: m["m"](x.permute(1, 0, 2, 3)), ACCEPTED, mods={"m": torch.nn.Conv2d(1, 2, 1)}),
    # -- view / clone / cat of one: always no-ops -------------------------------------------
    Case("view-alone", "aten.view_copy.default", ((1, 2, 3, 4),), lambda m, x: x.reshape(1, 6, 4), NOOP),
    Case("view-next-to-conv", "aten.view_copy.default", ((1, 2, 3, 4),),
         lambda m, x: m["m"](x).reshape(1, 6, 4), ACCEPTED, mods={"m": torch.nn.Conv2d(2, 2, 1)}),
    Case("clone-alone", "dim_order_ops._clone_dim_order.default", ((1, 2, 3, 4),), lambda m, x: x.clone(), NOOP),
    Case("clone-next-to-conv", "dim_order_ops._clone_dim_order.default", ((1, 2, 3, 4),),
         lambda m, x: m["m"](x.clone()), ACCEPTED, mods={"m": torch.nn.Conv2d(2, 2, 1)}),
    Case("cat-of-one-alone", "aten.cat.default", ((1, 2, 3, 4),), lambda m, x: torch.cat([x], 1), NOOP),
    Case("cat-of-two-alone", "aten.cat.default", ((1, 2, 3, 4), (1, 2, 3, 4)),
         lambda m, x, y: torch.cat([x, y], 1), ACCEPTED),
    # -- resize: scale 1 is a no-op ---------------------------------------------------------
    Case("nearest-scale-1-alone", "aten.upsample_nearest2d.vec", ((1, 2, 4, 4),),
         lambda m, x: F.interpolate(x, size=(4, 4), mode="nearest"), NOOP),
    Case("nearest-scale-2-alone", "aten.upsample_nearest2d.vec", ((1, 2, 4, 4),),
         lambda m, x: F.interpolate(x, scale_factor=2, mode="nearest"), ACCEPTED),
    Case("bilinear-scale-1-alone", "aten.upsample_bilinear2d.vec", ((1, 2, 4, 4),),
         lambda m, x: F.interpolate(x, size=(4, 4), mode="bilinear"), NOOP),
    Case("bilinear-scale-2-alone", "aten.upsample_bilinear2d.vec", ((1, 2, 4, 4),),
         lambda m, x: F.interpolate(x, scale_factor=2, mode="bilinear"), ACCEPTED),
    # -- mean: keepdim over size-1 dims only is a no-op -------------------------------------
    Case("mean-keepdim-size1-alone", "aten.mean.dim", ((1, 2, 1, 4),),
         lambda m, x: x.mean(2, keepdim=True), NOOP),
    Case("mean-keepdim-size4-alone", "aten.mean.dim", ((1, 2, 1, 4),),
         lambda m, x: x.mean(3, keepdim=True), ACCEPTED),
    Case("mean-size1-no-keepdim-alone", "aten.mean.dim", ((1, 2, 1, 4),), lambda m, x: x.mean(2), ACCEPTED),
    # -- ReLU / clamp that the input's int8 range collapses ---------------------------------
    Case("relu-hinge-in-range-alone", "aten.relu.default", ((1, 2, 3, 4),), lambda m, x: torch.relu(x), ACCEPTED),
    Case("relu-nonnegative-input-alone", "aten.relu.default", ((1, 2, 3, 4),), lambda m, x: torch.relu(x), NOOP,
         positive=True),
    Case("clamp-bounds-in-range-alone", "aten.clamp.default", ((1, 2, 3, 4),),
         lambda m, x: torch.clamp(x, -0.5, 0.5), ACCEPTED),
    Case("clamp-bounds-outside-range-alone", "aten.clamp.default", ((1, 2, 3, 4),),
         lambda m, x: torch.clamp(x, -100.0, 100.0), NOOP),
    Case("clamp-outside-range-next-to-conv", "aten.clamp.default", ((1, 2, 3, 4),),
         lambda m, x: m["m"](torch.clamp(x, -100.0, 100.0)), ACCEPTED, mods={"m": torch.nn.Conv2d(2, 2, 1)}),
    # -- x + 0 is a no-op, x + 1 is not -----------------------------------------------------
    Case("add-zero-alone", "aten.add.Tensor", ((1, 2, 3, 4),), lambda m, x: x + m["c"].value, NOOP,
         mods={"c": _Const(0.0)}),
    Case("add-one-alone", "aten.add.Tensor", ((1, 2, 3, 4),), lambda m, x: x + m["c"].value, ACCEPTED,
         mods={"c": _Const(1.0)}),
    Case("sub-zero-alone", "aten.sub.Tensor", ((1, 2, 3, 4),), lambda m, x: x - m["c"].value, NOOP,
         mods={"c": _Const(0.0)}),
    Case("zero-sub-alone", "aten.sub.Tensor", ((1, 2, 3, 4),), lambda m, x: m["c"].value - x, ACCEPTED,
         mods={"c": _Const(0.0)}),
    # -- clone dim order at a partition boundary --------------------------------------------
    Case("clone-boundary-channels-last", "dim_order_ops._clone_dim_order.default", ((1, 2, 3, 4),),
         lambda m, x: m["m"](x.clone()), ACCEPTED, mods={"m": torch.nn.Conv2d(2, 2, 1)},
         mutate=_boundary_dim_order((0, 2, 3, 1))),
    Case("clone-boundary-other-order", "dim_order_ops._clone_dim_order.default", ((1, 2, 3, 4),),
         lambda m, x: m["m"](x.clone()), DIM_ORDER, mods={"m": torch.nn.Conv2d(2, 2, 1)},
         mutate=_boundary_dim_order((0, 3, 1, 2))),
]  # fmt: skip


def _run(
    cases: list[Case], target: str = TARGET, options: dict[str, object] | None = None, path: str = "early"
) -> tuple[dict[str, tuple[bool, str]], list[Decision]]:
    """(on the NPU after partitioning, reason) of each case's node, as compile decides it on
    ``path``, and every decision."""
    return decide(cases, path, target, options)


def _partition(cases: list[Case], target: str = TARGET, path: str = "early") -> dict[str, tuple[bool, str]]:
    return _run(cases, target, path=path)[0]


@pytest.fixture(scope="module", params=PATHS)
def decisions(request: pytest.FixtureRequest) -> dict[str, tuple[bool, str]]:
    # One graph per case: the partitioner merges independent branches into one partition,
    # so cases sharing a graph would share partitions (and hide a lone no-op).
    out: dict[str, tuple[bool, str]] = {}
    for case in CASES:
        out |= _partition([case], path=request.param)
    return out


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_partition_condition(case: Case, decisions: dict[str, tuple[bool, str]]) -> None:
    assert case.id in decisions, f"no {case.op} node found for {case.id}"
    npu, reason = decisions[case.id]
    if case.expect == ACCEPTED:
        assert npu, f"{case.id} refused: {reason}"
    else:
        assert not npu and case.expect in reason, f"{case.id}: npu={npu}, reason {reason!r}"


def test_noop_reason_names_the_ops(decisions: dict[str, tuple[bool, str]]) -> None:
    """The report says which ops made the partition empty and why it stays off the NPU."""
    _, reason = decisions["view-alone"]
    assert reason == (
        "partition of no-op ops only (aten.view_copy.default): the neutron-c NPU compiler "
        "drops them, leaving nothing to run"
    )


@pytest.mark.parametrize("path", PATHS)
def test_clone_refused_at_the_boundary_leaves_the_conv_on_the_npu(path: str) -> None:
    """Only the clone leaves the NPU: the conv after it is partitioned again and stays."""
    case = next(c for c in CASES if c.id == "clone-boundary-other-order")
    got, every = _run([case], path=path)
    assert not got[case.id][0] and DIM_ORDER in got[case.id][1]
    convs = [d for d in every if d.op == "aten.convolution.default"]
    assert len(convs) == 1 and convs[0].npu and convs[0].partition, convs


STATIC_PERMUTE = Case("static-permute", "aten.permute_copy.default", ((1, 2, 4, 3),),
                      lambda m, x: x + m["c"].value.permute(0, 1, 3, 2), ACCEPTED, mods={"c": _Const(0.5)})  # fmt: skip


@pytest.mark.parametrize("path", PATHS)
def test_static_permute_alone_stays_off_the_npu(path: str) -> None:
    """A permute of a constant is folded: alone in its partition (its consumer kept off the
    NPU) it is refused as a no-op; next to the add that uses it, both go to the NPU."""
    op = STATIC_PERMUTE.op
    _, every = _run([STATIC_PERMUTE], options={"operators_not_to_delegate": ["aten.add.Tensor"]}, path=path)
    alone = [d for d in every if d.op == op]
    assert len(alone) == 1, every
    assert not alone[0].npu and NOOP in alone[0].reason and op in alone[0].reason, alone
    _, every = _run([STATIC_PERMUTE], path=path)
    together = [d for d in every if d.op in {op, "aten.add.Tensor"}]
    assert len(together) == 2 and all(d.npu for d in together), together


@pytest.mark.parametrize("path", PATHS)
def test_litert_target_still_delegates_noop_partitions(path: str) -> None:
    """The limit is Neutron's (target data): LiteRT runs a lone view or clone as it is."""
    cases = [c for c in CASES if c.id in {"view-alone", "clone-alone", "permute-size1-alone"}]
    got = _partition(cases, target="litert", path=path)
    assert all(npu for npu, _ in got.values()), got
