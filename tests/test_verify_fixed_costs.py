"""verify's fixed costs (issue 47): what it recomputes and what it takes on the hash chain's word,
each told; a float check that could not fold conv + BatchNorm says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from support import cli_in_process


class _ConvBnNone(torch.nn.Module):
    """conv + BatchNorm whose forward also returns None: the folded graph has a non-tensor
    output, which the direct rebuild of a program (``core.graph.program``) refuses."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.bn = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.bn.running_mean.uniform_(-0.5, 0.5)
        self.bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return torch.relu(self.bn(self.conv(x))), None


@pytest.fixture(scope="module")
def unfoldable(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import etforge

    out = tmp_path_factory.mktemp("unfoldable")
    calib = [(torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(i)),) for i in range(4)]
    etforge.compile(_ConvBnNone().eval(), calib[0], target="imxrt700cm", calibration=calib).save(out)
    return out


def test_a_float_check_that_cannot_fold_batch_norm_says_so(unfoldable: Path) -> None:
    """The float check falls back to the unfolded float program: the result, its note and
    ``verify --json`` name why; the gate still ran on every NPU op and held."""
    from etforge.runtime.verification.verify import verify

    v = verify(unfoldable, samples=2)
    assert v.ok, v.failures
    why = v.float_check_unfolded
    assert why is not None and "1 conv + BatchNorm pair(s) not folded" in why
    assert "an output is not a tensor of the graph" in why
    assert [n for n in v.notes if n.startswith("float check ran on the unfolded float program") and why in n]
    assert v.float_ops >= 1  # the unfolded program's NPU ops were still checked
    proc = cli_in_process("verify", str(unfoldable), "--samples", "2", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout[proc.stdout.index("{") :])["float_check_unfolded"] == why


def test_a_foldable_program_reports_no_fallback(unfoldable: Path) -> None:
    """The same conv + BatchNorm returning only its tensor folds: nothing to tell."""
    from etforge.runtime.verification.float_program import fold

    class Plain(_ConvBnNone):
        def forward(self, x: torch.Tensor) -> Any:  # type: ignore[override]
            return torch.relu(self.bn(self.conv(x)))

    x = torch.randn(1, 3, 8, 8)
    ep = torch.export.export(Plain().eval(), (x,))
    program, folds, why = fold(ep)
    assert (folds, why) == (1, None)
    _, none_folds, none_why = fold(torch.export.export(_ConvBnNone().eval(), (x,)))
    assert none_folds == 0 and none_why is not None and "not folded" in none_why
