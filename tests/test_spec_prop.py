"""``core/serialize/spec_prop.py``: ``to_executorch``'s spec propagation without its re-trace of
a graph ``LegalizePortableDimOrderPass`` just re-traced.

ExecuTorch's own ``SpecPropPass`` is the reference: on a re-traced graph (with and without
dim-order copies the legalization inserted) every node keeps the name, target and value a
second re-trace gives it and gets the same spec; compiled programs (CPU only, and with an NPU
delegate and its getitems) give the same ``.pte`` bytes either way.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from executorch.exir import EdgeCompileConfig, to_edge
from executorch.exir.passes.legalize_portable_dim_order_pass import LegalizePortableDimOrderPass
from executorch.exir.passes.spec_prop_pass import SpecPropPass

import etforge
from etforge.core.serialize import spec_prop


class ChannelsLastPool(torch.nn.Module):
    """A mean and an avg_pool2d on a channels-last tensor: the legalization inserts copies."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(x).contiguous(memory_format=torch.channels_last)
        return y.mean(dim=(2, 3)), torch.nn.functional.avg_pool2d(y, 2) + 1


class Plain(torch.nn.Module):
    """Nothing for the legalization to do."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2.0


def _spec_fields(spec: Any) -> Any:
    if isinstance(spec, (tuple, list)):
        return tuple(_spec_fields(s) for s in spec)
    if spec is None or isinstance(spec, (int, float, bool)):
        return spec
    return (
        tuple(spec.shape),
        spec.dtype,
        tuple(spec.dim_order),
        tuple(spec.stride),
        spec.const,
        spec.requires_grad,
        spec.is_sparse,
        spec.shape_dynamism,
    )


def _nodes(gm: torch.fx.GraphModule) -> list[tuple[Any, ...]]:
    out = []
    for n in gm.graph.nodes:
        val = n.meta.get("val")
        stride = val.stride() if isinstance(val, torch.Tensor) else None
        out.append((n.op, n.name, str(n.target), stride, _spec_fields(n.meta.get("spec"))))
    return out


@pytest.mark.parametrize("cls", [ChannelsLastPool, Plain])
def test_specs_of_a_fresh_trace_are_spec_prop_pass_specs(cls: type[torch.nn.Module]) -> None:
    exported = torch.export.export(cls(), (torch.randn(1, 3, 4, 4),))
    edge = to_edge(exported, compile_config=EdgeCompileConfig(_check_ir_validity=False))
    fresh = LegalizePortableDimOrderPass()(edge.exported_program().graph_module).graph_module
    copies = [n for n in fresh.graph.nodes if "_to_dim_order_copy" in str(n.target)]
    assert bool(copies) == (cls is ChannelsLastPool)  # the legalization acted where it should
    reference = SpecPropPass()(copy.deepcopy(fresh)).graph_module  # re-traces, then specs
    ours = spec_prop.SpecsOfFreshTrace()(copy.deepcopy(fresh)).graph_module  # specs only
    assert _nodes(ours) == _nodes(reference)
    assert all(n.meta.get("spec") is not None for n in ours.graph.nodes if n.op != "output")


def test_only_a_spec_pass_after_a_whole_re_trace_is_replaced() -> None:
    from executorch.exir.passes.remove_graph_asserts_pass import RemoveGraphAssertsPass

    legalize, spec, asserts = LegalizePortableDimOrderPass(), SpecPropPass(), RemoveGraphAssertsPass()
    assert spec_prop.always_retraces(legalize)
    assert not spec_prop.always_retraces(asserts)  # its own call: edits in place
    assert not spec_prop.always_retraces(spec)  # its own __call__
    replaced = spec_prop.fresh_specs([legalize, spec, asserts])
    assert replaced[0] is legalize and replaced[2] is asserts
    assert type(replaced[1]) is spec_prop.SpecsOfFreshTrace
    assert spec_prop.fresh_specs([asserts, spec])[1] is spec
    assert spec_prop.fresh_specs([spec])[0] is spec


@pytest.fixture
def upstream(monkeypatch: pytest.MonkeyPatch) -> None:
    """ExecuTorch's own SpecPropPass everywhere for the block."""
    monkeypatch.setattr(spec_prop, "SKIP", False)


class Head(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        return self.fc(y.mean(dim=(2, 3)))


def _pte(target: str) -> tuple[bytes, int]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(1, 3, 8, 8, generator=g),) for _ in range(3)]
    spec_prop.last_skipped[0] = 0
    compiled = etforge.compile(Head().eval(), calib[0], target=target, calibration=calib)
    return compiled.pte, spec_prop.last_skipped[0]


@pytest.mark.parametrize("target", ["cortex-m33", "imxrt700cm"])
def test_the_pte_is_the_upstream_bytes(target: str, request: pytest.FixtureRequest) -> None:
    fast, skipped = _pte(target)
    request.getfixturevalue("upstream")
    reference, none = _pte(target)
    assert (skipped, none) == (1, 0)
    assert fast == reference
