"""Deferred GraphModule code generation (``core/graph/deferred_code.py``) and shared node
provenance (``core/graph/shared_provenance.py``): every use of the generated code sees the
graph as it is, torch's methods come back after each scope, and a compile gives the same
bytes as with torch's eager code generation and copied provenance."""

from __future__ import annotations

import inspect
import pickle
import threading

import pytest
import torch
from torch import fx, nn

from etforge.api import compile as compile_model
from etforge.core.graph import deferred_code as dc
from etforge.core.graph import shared_provenance as sp
from etforge.core.graph.deferred_code import deferred_code


class TwoInputs(nn.Module):
    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * scale


def _edit(gm: fx.GraphModule) -> None:
    """relu -> sigmoid, then ``recompile()`` as a pass does. (Type hints dropped: under
    ``from __future__ import annotations`` they are strings, which torch cannot pickle.)"""
    for node in gm.graph.nodes:
        node.type = None
        if node.target is torch.relu:
            node.target = torch.sigmoid
    gm.recompile()


def _eager_twin() -> fx.GraphModule:
    gm = fx.symbolic_trace(TwoInputs())
    _edit(gm)
    return gm


def test_a_stale_module_generates_its_code_on_every_kind_of_use() -> None:
    x, s = torch.randn(2, 3), torch.randn(2, 3)
    expected = torch.sigmoid(x) * s
    eager = _eager_twin()
    with deferred_code():
        gm = fx.symbolic_trace(TwoInputs())
        _edit(gm)
        assert dc.stale(gm)  # the edit's recompile() was deferred
        assert torch.equal(gm(x, s), expected)  # a call runs the edited graph
        assert not dc.stale(gm)

        gm2 = fx.symbolic_trace(TwoInputs())
        _edit(gm2)
        assert gm2.code == eager.code  # the code property
        gm3 = fx.symbolic_trace(TwoInputs())
        _edit(gm3)
        assert inspect.signature(gm3.forward) == inspect.signature(eager.forward)  # as export reads it
        gm4 = fx.symbolic_trace(TwoInputs())
        _edit(gm4)
        retraced = fx.symbolic_trace(gm4)  # the tracer reads type(gm).forward
        assert torch.equal(retraced(x, s), expected)
        gm5 = fx.symbolic_trace(TwoInputs())
        _edit(gm5)
        assert torch.equal(pickle.loads(pickle.dumps(gm5))(x, s), expected)  # __reduce__ reads _code
        assert torch.equal(pickle.loads(pickle.dumps(gm5.recompile().src and gm5))(x, s), expected)
        gm6 = fx.symbolic_trace(TwoInputs())
        _edit(gm6)
        assert "sigmoid" in str(gm6)


def test_code_generated_before_the_scope_is_never_read_stale() -> None:
    """A module generated eagerly, edited inside: its old ``_code`` is behind the graph."""
    x, s = torch.randn(2, 3), torch.randn(2, 3)
    before = [fx.symbolic_trace(TwoInputs()) for _ in range(3)]
    for gm in before:
        gm.graph.eliminate_dead_code()  # ready, eager
    with deferred_code():
        for gm in before:
            _edit(gm)
        assert torch.equal(pickle.loads(pickle.dumps(before[0]))(x, s), torch.sigmoid(x) * s)
        assert "sigmoid" in str(before[1])
        assert torch.equal(before[2](x, s), torch.sigmoid(x) * s)


def test_export_of_a_stale_module_equals_eager() -> None:
    example = (torch.randn(2, 3), torch.randn(2, 3))
    eager = torch.export.export(_eager_twin(), example, strict=False)
    with deferred_code():
        gm = fx.symbolic_trace(TwoInputs())
        _edit(gm)
        deferred = torch.export.export(gm, example, strict=False)
    assert deferred.graph_module.code == eager.graph_module.code
    assert deferred.graph_signature == eager.graph_signature


def test_after_the_scope_torch_is_back_and_a_stale_module_still_generates_on_use() -> None:
    x, s = torch.randn(2, 3), torch.randn(2, 3)
    torch_methods = {n: fx.GraphModule.__dict__[n] for n in ("code", "__str__", "__reduce__", "recompile")}
    with deferred_code():
        modules = [fx.symbolic_trace(TwoInputs()) for _ in range(4)]
        for gm in modules:
            _edit(gm)
        with deferred_code():  # nested: the outer scope still holds
            pass
        assert fx.GraphModule.recompile is not dc._EAGER_RECOMPILE
    assert {n: fx.GraphModule.__dict__[n] for n in torch_methods} == torch_methods  # torch untouched
    assert all(dc.stale(gm) for gm in modules)  # nothing generated on the way out
    eager = _eager_twin()
    assert modules[0].code == eager.code
    assert str(modules[1]) == str(eager)
    assert torch.equal(pickle.loads(pickle.dumps(modules[2]))(x, s), torch.sigmoid(x) * s)
    assert torch.equal(modules[3](x, s), torch.sigmoid(x) * s)
    assert not any(dc.stale(gm) for gm in modules)
    assert not any(isinstance(v, dc._Mark) for gm in modules for v in vars(type(gm)).values())


def test_a_recompile_after_the_scope_is_torch_s_own() -> None:
    with deferred_code():
        gm = fx.symbolic_trace(TwoInputs())
        _edit(gm)
    for node in gm.graph.nodes:
        if node.target is torch.sigmoid:
            node.target = torch.tanh
    assert gm.recompile() is not None and "tanh" in gm.code  # eager again: a PythonCode back
    assert not any(isinstance(v, dc._Mark) for v in vars(type(gm)).values())


def test_threads_share_one_scope_until_the_last_leaves() -> None:
    inside, release = threading.Event(), threading.Event()

    def worker() -> None:
        with deferred_code():
            inside.set()
            release.wait(30)

    t = threading.Thread(target=worker)
    with deferred_code():
        t.start()
        assert inside.wait(30)
    assert fx.GraphModule.recompile is not dc._EAGER_RECOMPILE  # the worker is still inside
    release.set()
    t.join(30)
    assert fx.GraphModule.recompile is dc._EAGER_RECOMPILE


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu_(self.bn(self.conv(x)))
        y += 1.0
        return self.fc(y.mean((2, 3)))


@pytest.mark.parametrize("target", ["imxrt700cm", "cortex-m33"])
def test_a_compile_gives_the_bytes_of_eager_code_generation(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.manual_seed(0)
    model = Small().eval()
    example = (torch.randn(1, 3, 16, 16),)
    calibration = [(torch.randn(1, 3, 16, 16),) for _ in range(4)]
    deferred = compile_model(model, example, target=target, calibration=calibration)
    monkeypatch.setattr(dc, "ENABLED", False)
    monkeypatch.setattr(sp, "ENABLED", False)
    eager = compile_model(model, example, target=target, calibration=calibration)
    assert deferred.pte == eager.pte
    assert [p.processed for p in deferred.partitions] == [p.processed for p in eager.partitions]
    assert deferred.partitions or target == "cortex-m33"


def test_provenance_records_are_shared_inside_and_copied_outside() -> None:
    import copy

    from torch.fx.traceback import NodeSource

    gm = fx.symbolic_trace(TwoInputs())
    node = next(n for n in gm.graph.nodes if n.op == "call_function")
    node.meta["from_node"] = [NodeSource(None, "origin")]
    with sp.shared_provenance():
        record = NodeSource(node, "a_pass")
        assert copy.deepcopy(record) is record
        assert record.from_node[0] is node.meta["from_node"][0]  # the chain shared, not copied
        assert record.from_node is not node.meta["from_node"]  # the node's own list still copied
        assert record.to_dict() == NodeSource(node, "a_pass").to_dict()
    assert "__deepcopy__" not in vars(NodeSource)
    copied = copy.deepcopy(record)
    assert copied is not record and copied.to_dict() == record.to_dict()
    assert NodeSource(node, "a_pass").from_node[0] is not node.meta["from_node"][0]
