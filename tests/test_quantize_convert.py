"""convert()'s cuts compute what torchao computes: the histogram search with its bin scans on
Python floats, and the constant folding that no longer computes the dequantizations it drops."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchao.quantization.pt2e.constant_fold import ConstantFolder
from torchao.quantization.pt2e.observer import HistogramObserver

from etforge.core.build import pipeline
from etforge.core.quantize import constant_fold, histogram
from etforge.core.quantize.ptq import quantizer_for
from etforge.core.quantize.quantizer import calibrate, convert, prepare
from etforge.core.registry.manager import registry


def _observer(counts: torch.Tensor | None = None, low: float = -1.0, high: float = 3.0) -> HistogramObserver:
    obs = HistogramObserver(
        dtype=torch.int8, qscheme=torch.per_tensor_affine, quant_min=-128, quant_max=127, eps=2**-12
    )
    if counts is not None:
        obs.histogram.copy_(counts)
        obs.min_val.fill_(low)
        obs.max_val.fill_(high)
    return obs


def _ties() -> list[HistogramObserver]:
    """Histograms whose bin scans meet a bound that float32 and float64 order differently.

    300000 counts: the first step's lower bound is 1e-5 * 300000 = 3.0000000000000004 as a
    Python float and 3.0 in float32, and the first bin holds exactly 3. torch compares the
    float32 cumulative sum with the bound in float32 (not below it: the scan stops); compared
    as Python floats the scan would step past it, and the search ends elsewhere.
    """
    assert 1e-5 * 300000 > 3.0 and float(np.float32(1e-5 * 300000)) == 3.0
    out = []
    for mid in (3, 100, 1000, 2040):
        h = torch.zeros(2048)
        h[0], h[mid], h[2047] = 3, 300000 - 12, 9
        assert float(h.sum()) == 300000.0
        out.append(_observer(h))
    return out


def _observed() -> list[HistogramObserver]:
    """Observers fed as calibration feeds them: ranges that grow (the histogram re-binned),
    ReLU outputs (a spike at zero), heavy tails, a constant tensor, one value."""
    gen = torch.Generator().manual_seed(3)
    out = []
    for i in range(24):
        obs = _observer()
        for step in range(3):
            x = torch.randn(4000 + 97 * i, generator=gen) * (1 + step)
            if i % 4 == 1:
                x = torch.relu(x) * 6
            elif i % 4 == 2:
                x = x**3
            elif i % 4 == 3:
                x = torch.cat([x, torch.full((2500,), 5.0)])
            obs(x)
        out.append(obs)
    constant = _observer()
    constant(torch.full((64,), 0.25))
    single = _observer()
    single(torch.tensor([1.5]))
    return [*out, constant, single]


def _same(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> bool:
    return all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_histogram_qparams_are_torchaos_bit_for_bit() -> None:
    for obs in (*_ties(), *_observed()):
        assert _same(histogram.calculate_qparams(obs), HistogramObserver.calculate_qparams(obs))


def test_histogram_scan_rounds_its_bounds_to_float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tie hazard is real: bounds compared unrounded give another answer on every case."""
    monkeypatch.setattr(histogram, "_f32", lambda x: x)
    for obs in _ties():
        assert not _same(histogram.calculate_qparams(obs), HistogramObserver.calculate_qparams(obs))


def test_unobserved_histogram_answers_as_torchao() -> None:
    with pytest.warns(UserWarning):
        mine = histogram.calculate_qparams(_observer())
    with pytest.warns(UserWarning):
        assert _same(mine, HistogramObserver.calculate_qparams(_observer()))


class _ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 4, 3)
        self.fc = torch.nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        y = torch.relu(self.conv2(y)).mean((2, 3))
        return self.fc(y)


@pytest.mark.parametrize("target", ["cortex-m33", "imxrt700"])
def test_convert_cuts_change_nothing_and_skip_the_dropped_dequantizes(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The converted graph and constants with both cuts are those without them; with the
    folding cut no dequantize is computed, without it the folder computes each weight's."""
    torch.manual_seed(0)
    model = _ConvNet().eval()
    gen = torch.Generator().manual_seed(5)
    batches = [(torch.randn(1, 3, 10, 10, generator=gen) * (i + 1),) for i in range(4)]
    reg = registry()
    ep = pipeline.export(model, batches[0])
    computed: list[object] = []
    compute = constant_fold._COMPUTE

    def counting(folder: object, node: torch.fx.Node) -> object:
        computed.append(node.target)
        return compute(folder, node)

    # torchao's folder computes through counting, whether or not the cut's scope is on
    monkeypatch.setattr(ConstantFolder, "_deduce_value", counting)
    monkeypatch.setattr(constant_fold, "_COMPUTE", counting)
    converted = {}
    for cuts in (False, True):
        monkeypatch.setattr(constant_fold, "ENABLED", cuts)
        monkeypatch.setattr(histogram, "ENABLED", cuts)
        gm = prepare(ep.module(check_guards=False), quantizer_for(reg.target(target), reg=reg))
        calibrate(gm, batches)
        computed.clear()
        converted[cuts] = convert(gm)
        dequantizes = [t for t in computed if "dequantize" in str(t)]
        assert bool(dequantizes) is not cuts, (target, cuts, dequantizes)
    plain, cut = converted[False], converted[True]
    assert str(cut.graph) == str(plain.graph)
    for (name, value), (other_name, other) in zip(
        plain.state_dict().items(), cut.state_dict().items(), strict=True
    ):
        assert name == other_name and value.dtype == other.dtype and torch.equal(value, other), name
