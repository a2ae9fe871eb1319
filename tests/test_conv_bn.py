"""The conv + BatchNorm fold: torchao's result where torchao is exact, and the model's
own values on the graphs where torchao's fold changes them (a tapped conv, two BatchNorms on
one conv, a chain of BatchNorms, a weight shared by convs with different BatchNorms)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torchao.quantization.pt2e.utils import _fuse_conv_bn_

import etforge
from etforge.core.quantize.conv_bn import fold_conv_batch_norms
from etforge.runtime.verification.verify import compare


def _bn(n: int, gen: torch.Generator) -> nn.Module:
    bn = nn.BatchNorm2d(n)
    bn.running_mean.copy_(torch.randn(n, generator=gen))
    bn.running_var.copy_(torch.rand(n, generator=gen) + 0.5)
    bn.weight.data.copy_(torch.randn(n, generator=gen))
    bn.bias.data.copy_(torch.randn(n, generator=gen))
    return bn


class Mixed(nn.Module):
    """Conv+BN with and without a conv bias, a transposed conv+BN, a BN after a ReLU (not folded)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        gen = torch.Generator().manual_seed(0)
        self.a = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn_a = _bn(8, gen)
        self.b = nn.Conv2d(8, 8, 3, padding=1)
        self.bn_b = _bn(8, gen)
        self.bn_relu = _bn(8, gen)
        self.t = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.bn_t = _bn(4, gen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bn_a(self.a(x))
        x = self.bn_relu(torch.relu(self.bn_b(self.b(x))))
        return self.bn_t(self.t(x))


class Odd(nn.Module):
    """One conv and BatchNorm layout torchao's in-place fold gets wrong (or, ``recurrent``, right)."""

    def __init__(self, case: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        gen = torch.Generator().manual_seed(0)
        self.case = case
        self.conv = nn.Conv2d(4, 4, 1, bias=case != "two")
        self.bn1, self.bn2 = _bn(4, gen), _bn(4, gen)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.case == "tap":  # the conv's own output is read beside the BatchNorm's
            y = self.conv(x)
            return self.bn1(y) + y
        if self.case == "two":  # two BatchNorms on one conv
            y = self.conv(x)
            return self.bn1(y) * self.bn2(y)
        if self.case == "chain":
            return self.bn2(self.bn1(self.conv(x)))
        if self.case == "shared":  # one conv module called twice, a different BatchNorm each time
            return self.bn1(self.conv(x)) + self.bn2(self.conv(x))
        if self.case == "recurrent":  # one conv + BatchNorm block called twice: one weight suffices
            return self.bn1(self.conv(self.bn1(self.conv(x))))
        return self.bn2(self.bn1(self.conv(x))) - self.bn2(self.bn1(self.conv(x))) * 0.5


def _exported(model: nn.Module, x: torch.Tensor) -> torch.fx.GraphModule:
    return torch.export.export(model.eval(), (x,), strict=False).module(check_guards=False)


def _batch_norms(gm: torch.fx.GraphModule) -> int:
    return sum("batch_norm" in str(n.target) for n in gm.graph.nodes)


def test_the_fold_equals_torchaos_graph_and_tensors_where_torchao_is_exact() -> None:
    x = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    ours, theirs = _exported(Mixed(), x), _exported(Mixed(), x)
    fold_conv_batch_norms(ours)
    _fuse_conv_bn_(theirs)
    assert str(ours.graph) == str(theirs.graph)
    ours_state, theirs_state = ours.state_dict(), theirs.state_dict()
    assert ours_state.keys() == theirs_state.keys()
    for name, value in theirs_state.items():
        assert torch.equal(ours_state[name], value), name
    assert _batch_norms(ours) == 1  # the BN after the ReLU


@pytest.mark.parametrize("case", ["tap", "two", "chain", "shared", "recurrent", "recurrent_chain"])
def test_the_folded_graph_computes_the_model(case: str) -> None:
    model = Odd(case).eval()
    x = torch.randn(2, 4, 5, 5, generator=torch.Generator().manual_seed(3))
    gm = _exported(model, x)
    fold_conv_batch_norms(gm)
    assert _batch_norms(gm) == 0
    torch.testing.assert_close(gm(x), model(x), rtol=1e-5, atol=1e-5)
    if case == "recurrent":  # a block called twice keeps one weight, as torchao's fold does
        convs = [n for n in gm.graph.nodes if n.target == torch.ops.aten.conv2d.default]
        assert len(convs) == 2 and len({c.args[1].target for c in convs}) == 1


def test_a_tapped_conv_batch_norm_compiles_to_the_models_values() -> None:
    """End to end: the quantized program tracks the float model, not the torchao-folded one."""
    model = Odd("two").eval()
    gen = torch.Generator().manual_seed(1)
    calib = [(torch.randn(1, 4, 8, 8, generator=gen),) for _ in range(8)]
    c = etforge.compile(model, calib[0], "imxrt700", calibration=calib)
    r = c.result
    v = compare(r.host_program, r.float_program, r.quantized_program, c.report, samples=8)
    assert v.ok, v.failures
    x = calib[0][0]
    got = r.quantized_program.module()(x)
    assert float((got - model(x)).abs().max()) < 0.1 * float(model(x).abs().max())
