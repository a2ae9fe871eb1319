"""The deferred-DCE conv+BatchNorm fold gives exactly torchao's fold: same graph, same tensors."""

from __future__ import annotations

import torch
from torch import nn
from torchao.quantization.pt2e.utils import _fuse_conv_bn_

from etforge.core.quantize.conv_bn import fold_conv_batch_norms


class Mixed(nn.Module):
    """Conv+BN with and without a conv bias, a transposed conv+BN, a BN after a ReLU (not
    folded), and (``shared``) one conv feeding two BatchNorms: torchao folds the first into the
    conv and drops the second ("fake fuse"), which changes what the model computes."""

    def __init__(self, shared: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.two_bns = shared
        self.a = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn_a = nn.BatchNorm2d(8)
        self.b = nn.Conv2d(8, 8, 3, padding=1)
        self.bn_b = nn.BatchNorm2d(8)
        self.bn_relu = nn.BatchNorm2d(8)
        self.t = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.bn_t = nn.BatchNorm2d(4)
        self.shared = nn.Conv2d(4, 4, 1)
        self.bn_s1 = nn.BatchNorm2d(4)
        self.bn_s2 = nn.BatchNorm2d(4)
        gen = torch.Generator().manual_seed(0)
        for bn in (self.bn_a, self.bn_b, self.bn_relu, self.bn_t, self.bn_s1, self.bn_s2):
            n = bn.num_features
            bn.running_mean.copy_(torch.randn(n, generator=gen))
            bn.running_var.copy_(torch.rand(n, generator=gen) + 0.5)
            bn.weight.data.copy_(torch.randn(n, generator=gen))
            bn.bias.data.copy_(torch.randn(n, generator=gen))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bn_a(self.a(x))
        x = self.bn_relu(torch.relu(self.bn_b(self.b(x))))
        x = self.bn_t(self.t(x))
        y = self.shared(x)
        return self.bn_s1(y) + self.bn_s2(y) if self.two_bns else self.bn_s1(y)


def _folded(fold: object) -> torch.fx.GraphModule:
    model = Mixed().eval()
    example = (torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(1)),)
    gm = torch.export.export(model, example, strict=False).module(check_guards=False)
    fold(gm)  # type: ignore[operator]
    return gm


def test_the_fold_equals_torchaos_graph_and_tensors() -> None:
    ours, theirs = _folded(fold_conv_batch_norms), _folded(_fuse_conv_bn_)
    assert str(ours.graph) == str(theirs.graph)
    ours_state, theirs_state = ours.state_dict(), theirs.state_dict()
    assert ours_state.keys() == theirs_state.keys()
    for name, value in theirs_state.items():
        assert torch.equal(ours_state[name], value), name
    bns = [n for n in ours.graph.nodes if "batch_norm" in str(n.target)]
    assert len(bns) == 1  # the BN after the ReLU


def test_the_folded_model_computes_the_unfolded_one() -> None:
    model = Mixed(shared=False).eval()
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(3))
    gm = torch.export.export(model, (x,), strict=False).module(check_guards=False)
    fold_conv_batch_norms(gm)
    torch.testing.assert_close(gm(x), model(x), rtol=1e-5, atol=1e-5)
