"""The compile's float check (``core/build/equivalence``): an edit of the float graph that
changes the model's meaning is found, traced to its stage, reported, and fails ``verify``.

``verify`` compares the compiled model with references built from the edited graph; without
this check a rewrite plugin or a fold that computes another function passes it (stop 41's
conv + BatchNorm fold did).
"""

from __future__ import annotations

import pytest
import torch

import etforge
from etforge.core.build import equivalence
from etforge.core.common.errors import EtforgeError
from etforge.core.contracts.hookspecs import hookimpl
from etforge.core.contracts.rewrite import Rewrite
from etforge.core.graph.utils import node_op
from etforge.core.registry.manager import extra_plugins

TARGET = "cortex-m33"  # every CPU target runs the front end's rewrites and the quantizer's fold


class Residual(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)
        self.head = torch.nn.Linear(4 * 6 * 6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x))) + x
        return self.head(y.flatten(1))


def _model() -> tuple[torch.nn.Module, tuple[torch.Tensor], list[tuple[torch.Tensor]]]:
    torch.manual_seed(0)
    model = Residual().eval()
    with torch.no_grad():  # BatchNorm statistics a trained model has, so the fold does work
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 2.0)
    calib = [(torch.randn(1, 4, 6, 6),) for _ in range(4)]
    return model, calib[0], calib


class AddAsSub(Rewrite):
    """A third party's wrong rewrite: the residual add becomes a subtraction."""

    def apply(self, gm: torch.fx.GraphModule, target: object) -> bool:
        changed = False
        for node in gm.graph.nodes:
            if node_op(node) == "aten.add.Tensor":
                node.target = torch.ops.aten.sub.Tensor
                changed = True
        return changed


class Plugin:
    __name__ = "wrong_rewrite_plugin"

    @staticmethod
    @hookimpl
    def etforge_rewrites() -> list[Rewrite]:
        return [AddAsSub()]


def test_a_faithful_compile_passes_the_check_within_float32_noise() -> None:
    model, example, calib = _model()
    compiled = etforge.compile(model, example, TARGET, calibration=calib)
    same = compiled.report["float_equivalence"]
    assert same["passed"] and same["compared"] == "the observed model", same
    # float32 evaluation-order noise of the BatchNorm fold, far inside the documented tolerance
    assert 0 < same["scale"] and same["max_abs"] <= equivalence.FLOAT_EDIT_REL_TOL * same["scale"] / 10
    with torch.no_grad():
        reference = model(*calib[0])
    assert same["scale"] == pytest.approx(float(reference.abs().max()), rel=1e-5)


def test_a_rewrite_that_changes_the_model_is_named_and_fails_verify() -> None:
    model, example, calib = _model()
    with extra_plugins(Plugin()):
        compiled = etforge.compile(model, example, TARGET, calibration=calib)
        same = compiled.report["float_equivalence"]
        assert not same["passed"] and "AddAsSub" in same["why"], same
        v = compiled.verify(samples=4)
    # the compiled model agrees with its (edited) references; the check alone says it is wrong
    assert not v.ok and "does not compute the exported model" in v.failures[0], v.failures
    assert "AddAsSub" in v.failures[0]


def test_strict_refuses_a_model_the_edits_changed() -> None:
    model, example, calib = _model()
    with extra_plugins(Plugin()), pytest.raises(EtforgeError, match="does not compute.*AddAsSub"):
        etforge.compile(model, example, TARGET, calibration=calib, strict=True)


def test_a_wrong_batch_norm_fold_is_traced_to_the_quantizer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fold as torchao's fake fuse did it on tapped convs: the BatchNorm dropped, not folded."""
    from etforge.core.quantize import conv_bn

    def drop_batch_norms(gm: torch.fx.GraphModule) -> None:
        for node in list(gm.graph.nodes):
            if "batch_norm" in node_op(node):
                getitem = next(iter(node.users))
                getitem.replace_all_uses_with(node.args[0])
        gm.graph.eliminate_dead_code()
        gm.recompile()

    monkeypatch.setattr(conv_bn, "fold_conv_batch_norms", drop_batch_norms)
    model, example, calib = _model()
    same = etforge.compile(model, example, TARGET, calibration=calib).report["float_equivalence"]
    assert not same["passed"] and "the quantizer's preparation" in same["why"], same


@pytest.mark.parametrize(
    ("exported", "edited", "passed"),
    [
        ({"a": torch.ones(3)}, {"a": torch.ones(3) * (1 + 1e-6)}, True),
        ({"a": torch.ones(3)}, {"a": torch.ones(3) * 1.01}, False),
        ((torch.zeros(2), torch.tensor([1, 2])), (torch.full((2,), 1e-7), torch.tensor([1, 2])), True),
        ((torch.zeros(2), torch.tensor([1, 2])), (torch.zeros(2), torch.tensor([1, 3])), False),
        (torch.tensor([float("nan"), 1.0]), torch.tensor([float("nan"), 1.0]), True),
        (torch.tensor([float("nan"), 1.0]), torch.tensor([0.0, 1.0]), False),
        ((torch.ones(2),), [torch.ones(2)], False),
    ],
)
def test_compare(exported: object, edited: object, passed: bool) -> None:
    assert equivalence.compare(exported, edited, "x").passed is passed
