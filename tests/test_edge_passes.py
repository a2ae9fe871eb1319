"""``core/lower/edge_passes.py``: to_edge's passes with the idle re-traces skipped give the
program ExecuTorch's own ``_generate_edge_program`` gives, byte for byte, on programs that make
each skippable pass act and on programs where it has nothing to do."""

from __future__ import annotations

import copy

import pytest
import torch
from executorch.exir import EdgeCompileConfig, EdgeProgramManager
from executorch.exir.program._program import _generate_edge_program
from executorch.exir.tracer import _default_decomposition_table

from etforge.core.lower.edge_passes import RULES, edge_program


class Transpose(torch.nn.Module):  # aten.t and aten.view left whole (not decomposed)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x.t() @ x).view(-1)


class Scalar(torch.nn.Module):  # add.Tensor(x, 2.0): a Python number for a Tensor argument
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.add.Tensor(x, 2.0) * 3


class Mixed(torch.nn.Module):  # float + int tensor: promoted by a _to_copy
    def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.add.Tensor(x, n)


class Layout(torch.nn.Module):  # clone with a memory format: a dim-order op
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x).clone(memory_format=torch.channels_last)


class Conv(torch.nn.Module):  # nothing for any skippable pass once decomposed
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.fc = torch.nn.Linear(4 * 6 * 6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


X = torch.randn(4, 4)
IMG = torch.randn(1, 3, 8, 8)
CASES = {
    # model, example, decompose first, passes with work on the program as exported
    "transpose": (
        Transpose(),
        (X,),
        False,
        {
            "NormalizeTransposePass",
            "ReplaceBrokenOpsWithFunctionalOpsPass",
            "ReplaceViewOpsWithViewCopyOpsPass",
        },
    ),
    "scalar": (Scalar(), (X,), False, {"ScalarToTensorPass"}),
    "mixed": (Mixed(), (X, torch.arange(16).reshape(4, 4)), False, {"RemoveMixedTypeOperators"}),
    "layout": (Layout(), (IMG,), False, set()),  # MemoryFormatOpsPass rides on OpReplacePass
    "conv": (Conv(), (IMG,), True, set()),
}


def _programs(model: torch.nn.Module, example: tuple[torch.Tensor, ...], decompose: bool) -> tuple:
    ep = torch.export.export(model, example, strict=False)
    if decompose:
        ep = ep.run_decompositions(_default_decomposition_table())
    return copy.deepcopy(ep), ep


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_program_as_executorch(case: str) -> None:
    model, example, decompose, _ = CASES[case]
    config = EdgeCompileConfig(_check_ir_validity=False)
    theirs_in, ours_in = _programs(model, example, decompose)
    theirs = _generate_edge_program(config, theirs_in, preserve_ops=[])
    ours, skipped = edge_program(config, ours_in, [])
    assert set(skipped) <= set(RULES)
    assert "OpReplacePass" not in skipped
    assert ours.graph_module.code == theirs.graph_module.code
    a = EdgeProgramManager({"forward": theirs}, None, config).to_executorch().buffer
    b = EdgeProgramManager({"forward": ours}, None, config).to_executorch().buffer
    assert a == b
    if case == "layout":  # the combined re-trace gave clone its dim-order form
        assert "_clone_dim_order" in ours.graph_module.code
    if case == "conv":  # an idle program: the re-traces with nothing to do are skipped
        assert {"SymToTensorPass", "ScalarToTensorPass", "NormalizeTransposePass"} <= set(skipped)


@pytest.mark.parametrize("case", ["transpose", "scalar", "mixed"])
def test_each_rule_sees_its_work(case: str) -> None:
    """A rule that missed its pass's work would skip it: the programs would differ. Here the
    rule alone is asked, on the program as the pass would see it."""
    model, example, decompose, acting = CASES[case]
    ep = _programs(model, example, decompose)[1]
    gm = ep.graph_module
    for name in acting:
        assert RULES[name](gm), name
    assert not RULES["SymToTensorPass"](gm)
