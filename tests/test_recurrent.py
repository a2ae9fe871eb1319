"""Recurrent layers: an LSTM and a GRU keyword spotter compile and verify on the NPU targets.

``nn.LSTM`` / ``nn.GRU`` export as one op that decomposes per time step after quantization:
the input projection's single dequantize becomes one slice per step, read by as many
partitions. Each partition must read int8 (``core/graph/dequant_copies.py``), and a slice onto
other qparams must requantize after it, not copy codes across grids
(``ConversionContext.output(like=...)``); verify's device-exact rule for that requantize is
``runtime.arithmetic.device_ref``'s relabel rule. Before both, these models were a LiteRT load error
(``RESHAPE`` float32 -> int8) or 30-60 steps off on imxrt700.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.export import export

import etforge
from etforge.core.graph.dequant_copies import split_shared_dequantizes
from etforge.core.graph.utils import is_dequantize


class Spotter(nn.Module):
    """Conv1d front, a recurrent layer, the last step classified: a keyword spotter's shape."""

    def __init__(self, cell: type[nn.Module]) -> None:
        super().__init__()
        self.conv = nn.Conv1d(10, 16, 3, padding=1)
        self.rnn = cell(16, 24, batch_first=True)
        self.fc = nn.Linear(24, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x)).transpose(1, 2)
        out, _ = self.rnn(h)
        return self.fc(out[:, -1])


def _calibration() -> list[tuple[torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(1, 10, 8, generator=g),) for _ in range(6)]


@pytest.mark.parametrize(
    ("cell", "target"),
    [(nn.LSTM, "imxrt700"), (nn.LSTM, "imxrt700cm"), (nn.GRU, "imxrt700cm")],
    ids=["lstm-imxrt700", "lstm-imxrt700cm", "gru-imxrt700cm"],
)
def test_recurrent_layer_compiles_and_verifies(cell: type[nn.Module], target: str) -> None:
    torch.manual_seed(0)
    calibration = _calibration()
    compiled = etforge.compile(Spotter(cell).eval(), calibration[0], target=target, calibration=calibration)
    assert compiled.report["partitions"], "the front conv and the projections run on the NPU"
    verification = compiled.verify(samples=4)
    assert verification.ok, verification.failures


class Unbound(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (*torch.unbind(x, 1), x)


def test_each_reader_gets_its_own_dequantize_and_the_output_keeps_the_original() -> None:
    x = torch.randn(1, 3, 4)
    gm = export(Unbound(), (x,)).module()
    graph = gm.graph
    placeholder = next(n for n in graph.nodes if n.op == "placeholder")
    with graph.inserting_after(placeholder):
        q = graph.call_function(
            torch.ops.quantized_decomposed.quantize_per_tensor.default,
            (placeholder, 0.05, 0, -128, 127, torch.int8),
        )
    with graph.inserting_after(q):
        dq = graph.call_function(
            torch.ops.quantized_decomposed.dequantize_per_tensor.default, (q, 0.05, 0, -128, 127, torch.int8)
        )
    placeholder.replace_all_uses_with(dq, delete_user_cb=lambda n: n is not q)
    gm.recompile()
    readers = [u for u in dq.users if u.op != "output"]
    expected = gm(x)

    made = split_shared_dequantizes(gm)

    assert made == len(readers)  # the graph output keeps the original; each reader gets a copy
    dqs = [n for n in graph.nodes if is_dequantize(n)]
    assert all(len(n.users) == 1 for n in dqs)
    assert next(n for n in graph.nodes if n.op == "output").args[0][-1] is dq
    for got, want in zip(gm(x), expected, strict=True):
        assert torch.equal(got, want)
