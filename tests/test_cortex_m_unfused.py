"""A ReLU ExecuTorch's Cortex-M lowering cannot fuse keeps its conv quantized
(plugins/targets/cortex_m_unfused.py).

A U-Net skip: ``conv -> relu`` feeds a ``cat`` with a transposed conv's output, so the
ReLU's output shares qparams whose zero point is above -128 and ``ActivationFusionPass``
refuses the fusion. Without the pass the conv stayed an ``aten.convolution`` on int8 values
(the portable kernel computing on raw int8 numbers: 134 steps off the quantized model).
With it the conv is CMSIS-NN's and the ReLU a portable int8 clamp of its codes; verify pairs
the two (both hold the one PT2E quantize node) and holds them to the conv's CMSIS-NN
reference with the ReLU's clamp (``runtime/verification/stepwise.py``, ``HostInt8Values.forced``): every
value exact, the whole program equal to its device simulation.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import etforge
from etforge.core.common.errors import EtforgeError


class SkipHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.e1 = nn.Conv2d(3, 8, 3, padding=1)
        self.e2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.head = nn.Conv2d(16, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = F.relu(self.e1(x), inplace=True)
        u = torch.cat([self.up(self.e2(a)), a], 1)  # a's qparams shared with the cat's
        return self.head(u)


def test_an_unfused_relu_keeps_its_conv_quantized() -> None:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(1, 3, 16, 16, generator=g),) for _ in range(8)]
    compiled = etforge.compile(SkipHead().eval(), calib[0], "cortex-m33", calibration=calib)
    ops = [str(n.target) for n in compiled.result.host_program.graph.nodes if n.op == "call_function"]
    assert not [op for op in ops if "aten.convolution" in op], ops
    v = compiled.verify(samples=4)
    assert v.ok, v.failures
    assert v.cpu_op_max_steps == 0, v.failures


def test_an_aten_op_left_on_int8_codes_is_a_compile_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the pass, ExecuTorch leaves the conv an ``aten.convolution`` on int8 codes:
    ``plugins/targets/cortex_m_int8_codes.py`` refuses that program, naming the node, instead of writing it."""
    from etforge.plugins.targets import cortex_m_unfused

    monkeypatch.setattr(cortex_m_unfused, "with_unfused_activations", lambda passes: passes)
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(1, 3, 16, 16, generator=g),) for _ in range(4)]
    with pytest.raises(
        EtforgeError, match=r"int8 codes as if they were real values: \w+ \(aten\.convolution"
    ):
        etforge.compile(SkipHead().eval(), calib[0], "cortex-m33", calibration=calib)


class GatedReLU6(nn.Module):
    """rexnet's block tail: an SE gate's product, then ReLU6 (ExecuTorch fuses no activation
    into a mul, and its clamp pass saw the product as float: 115 steps off)."""

    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c, c, 3, padding=1)
        self.gate = nn.Conv2d(c, c, 1)
        self.act = nn.ReLU6()  # hardtanh (F.relu6 is aten.relu6, left float by the quantizer)
        self.out = nn.Conv2d(c, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return self.out(self.act(y * torch.sigmoid(self.gate(y))))


def _gated_data() -> list[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(1, 8, 6, 6, generator=g),) for _ in range(8)]


def test_an_unfused_relu6_after_a_gate_clamps_at_its_quantized_bounds() -> None:
    torch.manual_seed(0)
    calib = _gated_data()
    compiled = etforge.compile(GatedReLU6().eval(), calib[0], "cortex-m33", calibration=calib)
    clamps = [n for n in compiled.result.host_program.graph.nodes if "clamp" in str(n.target)]
    assert clamps and all(isinstance(b, int) for n in clamps for b in n.args[1:3] if b is not None)
    v = compiled.verify(samples=4)
    assert v.ok, v.failures
    assert v.cpu_op_max_steps == 0, v.failures


def test_a_clamp_at_real_bounds_on_codes_is_a_compile_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the rewrite the ReLU6 stays ``aten.hardtanh(x, 0.0, 6.0)`` on int8 codes:
    refused by ``cortex_m_int8_codes.py``, naming it."""
    from etforge.plugins.targets import cortex_m_unfused

    monkeypatch.setattr(cortex_m_unfused, "_clamp_on_codes", lambda node: False)
    torch.manual_seed(0)
    calib = _gated_data()
    with pytest.raises(EtforgeError, match=r"int8 codes as if they were real values: \w+ \(aten\.hardtanh"):
        etforge.compile(GatedReLU6().eval(), calib[0], "cortex-m33", calibration=calib)
