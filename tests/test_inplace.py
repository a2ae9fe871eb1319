"""In-place ops are functionalized in the front end, exactly: a model written with
``inplace=True`` activations, ``+=`` and ``mul_`` compiles to the same ``model.pte`` bytes as
its twin written with functional ops, on every target and both lowering paths.

(torch.export keeps ``aten.relu_``, ``aten.add_`` … as written; before the front end made
them functional, imxrt700 refused them for lacking an out variant and the early path fell
back to the classic one.)
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import etforge
from etforge.core.front.functionalize import functional_form, functionalize

#: (target, lowering) pairs compiled: cortex-m33 has no NPU, its one path is the classic one.
CASES = (
    ("imxrt700", "early"),
    ("imxrt700", "classic"),
    ("imxrt700cm", "early"),
    ("imxrt700cm", "classic"),
    ("cortex-m33", "early"),
)


class Block(nn.Module):
    """conv-BN-ReLU, ReLU6, hardswish, a residual sum, a scale, SiLU, pool, dropout, linear:
    each activation and arithmetic op either in place (as torchvision writes them) or not."""

    def __init__(self, inplace: bool) -> None:
        super().__init__()
        self.inplace = inplace
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.conv3 = nn.Conv2d(8, 8, 1)
        self.relu = nn.ReLU(inplace=inplace)
        self.relu6 = nn.ReLU6(inplace=inplace)
        self.hardswish = nn.Hardswish(inplace=inplace)
        self.silu = nn.SiLU(inplace=inplace)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.drop = nn.Dropout(0.2, inplace=inplace)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.bn(self.conv1(x)))
        z = self.hardswish(self.conv3(self.relu6(self.conv2(y))))
        if self.inplace:
            z += y
            z.mul_(0.5)
        else:
            z = z + y
            z = z * 0.5
        z = self.silu(z)
        return self.fc(self.drop(torch.flatten(self.pool(z), 1)))


def _pair() -> tuple[nn.Module, nn.Module, list[tuple[torch.Tensor, ...]]]:
    torch.manual_seed(0)
    inplace = Block(inplace=True).eval()
    with torch.no_grad():  # non-trivial BN statistics, the same in both
        inplace.bn.running_mean.uniform_(-0.5, 0.5)
        inplace.bn.running_var.uniform_(0.5, 2.0)
    functional = Block(inplace=False).eval()
    functional.load_state_dict(inplace.state_dict())
    g = torch.Generator().manual_seed(1)
    return inplace, functional, [(torch.randn(1, 3, 12, 12, generator=g),) for _ in range(4)]


def test_export_keeps_in_place_ops_and_the_front_end_removes_them() -> None:
    inplace, functional, calib = _pair()
    ep = torch.export.export(inplace, calib[0], strict=False)
    mutating = {
        str(n.target) for n in ep.graph.nodes if n.op == "call_function" and n.target._schema.is_mutable
    }
    # The premise: torch.export leaves these (else this file would test nothing).
    assert {
        "aten.relu_.default",
        "aten.hardtanh_.default",
        "aten.add_.Tensor",
        "aten.silu_.default",
    } <= mutating
    out, notes = functionalize(ep)
    assert notes == []  # every mutation here is local: no re-trace
    twin = torch.export.export(functional, calib[0], strict=False)
    ours = [(n.name, str(n.target)) for n in out.graph.nodes]
    assert ours == [(n.name, str(n.target)) for n in twin.graph.nodes]
    assert [s.arg for s in out.graph_signature.output_specs] == [
        s.arg for s in twin.graph_signature.output_specs
    ]
    torch.testing.assert_close(out.module()(*calib[1]), functional(*calib[1]), rtol=0, atol=0)


def test_functional_forms() -> None:
    aten = torch.ops.aten
    assert functional_form(aten.relu_.default) is aten.relu.default
    assert functional_form(aten.add_.Tensor) is aten.add.Tensor
    assert functional_form(aten.hardtanh_.default) is aten.hardtanh.default
    assert functional_form(aten.dropout_.default) is aten.dropout.default
    assert functional_form(aten.relu.default) is None  # writes nothing


@pytest.mark.parametrize(("target", "lowering"), CASES)
def test_in_place_model_compiles_to_the_functional_twins_bytes(target: str, lowering: str) -> None:
    inplace, functional, calib = _pair()
    a = etforge.compile(inplace, calib[0], target=target, calibration=calib, lowering=lowering)
    b = etforge.compile(functional, calib[0], target=target, calibration=calib, lowering=lowering)
    assert a.pte == b.pte
    assert [p.converted.tflite for p in a.partitions] == [p.converted.tflite for p in b.partitions]
    if target != "cortex-m33":
        assert a.partitions, "the NPU took nothing: the test would not cover the delegated path"
        assert a.report["lowering"]["path"] == lowering, a.report["lowering"]


class WritesThroughView(nn.Module):
    """An in-place op on a view whose base is read afterwards: not a local rewrite."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        y[:, :2].relu_()  # writes half of y's channels
        return y * 2


def test_write_through_a_view_is_functionalized_by_torch_and_said() -> None:
    torch.manual_seed(0)
    model = WritesThroughView().eval()
    x = torch.randn(1, 3, 4, 4)
    ep = torch.export.export(model, (x,), strict=False)
    out, notes = functionalize(ep, owned=False)
    assert any(n.op == "call_function" and n.target._schema.is_mutable for n in ep.graph.nodes)  # not edited
    assert not any(
        n.op == "call_function"
        and getattr(n.target, "_schema", None) is not None
        and n.target._schema.is_mutable
        for n in out.graph.nodes
    )
    assert len(notes) == 1 and "relu_" in notes[0] and "shares memory" in notes[0], notes
    torch.testing.assert_close(out.module()(x), model(x), rtol=0, atol=0)


class KeepsLast(nn.Module):
    """Writes a buffer (``copy_``): a state update, functionalized by torch into a buffer output."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.register_buffer("last", torch.zeros(1, 8, 1, 1))
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = torch.relu(self.conv(x)).mean((2, 3), keepdim=True)
        self.last.copy_(pooled)
        return self.fc(torch.flatten(pooled + self.last, 1))


def test_buffer_copy_compiles_and_verifies_with_a_note() -> None:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(1, 3, 8, 8, generator=g),) for _ in range(4)]
    compiled = etforge.compile(KeepsLast().eval(), calib[0], target="imxrt700", calibration=calib)
    notes = compiled.report["notes"]
    assert any("copy_" in n and "b_last" in n for n in notes), notes
    assert compiled.partitions and compiled.report["lowering"]["path"] == "early"
    verification = compiled.verify(samples=4)
    assert verification.ok, verification.failures


class Accumulates(nn.Module):
    """Reads a buffer, then updates it: each call depends on the calls before it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.register_buffer("acc", torch.zeros(1, 8, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        out = y + self.acc
        self.acc.add_(y.mean((2, 3), keepdim=True))
        return out


@pytest.mark.parametrize("quantize", [True, False])
def test_a_running_state_is_refused_naming_the_buffer(quantize: bool) -> None:
    """Every stage failed on it with an unrelated error; the front end names the buffer."""
    from etforge.core.common.errors import EtforgeError

    x = torch.randn(1, 3, 8, 8)
    with pytest.raises(EtforgeError, match="reads buffer 'acc' and updates it in forward"):
        etforge.compile(Accumulates().eval(), (x,), target="cortex-m33", quantize=quantize)
