"""Values int8 cannot hold, met by models people download.

- EfficientViT's linear attention divides by ``x + eps``: int8 rounded the small divisors to
  0, the float division on the CPU made inf and 0/0 = NaN, and what a quantize makes of a
  NaN differs between x86 and Arm (``verify`` then blamed the memory plan). A division by a
  tensor now keeps its divisor float (``plugins/ops/elementwise.py``, ``_float_divisor``),
  told as a fallback.
- A model computing a NaN in float (the square root of a negative) failed in torchao's
  observers with torch's words; now one error names the sample, node and op.
- ``verify`` names the instruction writing NaN/infinite values as the cause of a
  ``.pte``/Edge difference, instead of a memory-plan overlap.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import etforge
from etforge.core.common.errors import EtforgeError
from etforge.core.graph.utils import node_op


class LinearAttention(nn.Module):
    """EfficientViT's LiteMLA core: ReLU kernels, v padded with ones, a normalizing division."""

    def __init__(self, c: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.qkv = nn.Conv2d(c, 3 * c, 1)
        self.proj = nn.Conv2d(c, c, 1)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        qkv = self.qkv(x).reshape(b, -1, 3 * c // self.heads, h * w).transpose(-1, -2)
        q, k, v = qkv.chunk(3, dim=-1)
        q, k = F.relu(q), F.relu(k)
        v = F.pad(v, (0, 1), mode="constant", value=1.0)
        out = q @ (k.transpose(-1, -2) @ v)
        out = out[..., :-1] / (out[..., -1:] + 1e-5)
        return self.proj(out.transpose(-1, -2).reshape(b, -1, h, w))


def _data(*shape: int) -> tuple[tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(*shape, generator=g),) for _ in range(8)]
    return calib[0], calib


@pytest.mark.parametrize("target", ["imxrt700", "imxrt700cm"])
def test_a_divisor_plus_eps_stays_float_and_verifies(target: str) -> None:
    torch.manual_seed(0)
    example, calib = _data(1, 16, 6, 6)
    compiled = etforge.compile(LinearAttention().eval(), example, target=target, calibration=calib)
    graph = compiled.result.host_program.graph
    div = next(n for n in graph.nodes if node_op(n) == "aten.div.Tensor")
    divisor = div.args[1]
    assert node_op(divisor) == "aten.add.Tensor" and divisor.meta["val"].dtype == torch.float32
    eps = [a for a in divisor.all_input_nodes if not node_op(a).startswith(("cortex_m", "quantized"))]
    assert eps, f"the eps was quantized: {[node_op(a) for a in divisor.all_input_nodes]}"
    kept = [f for f in compiled.report["fallbacks"] if f["what"] == "kept float (runs on the CPU)"]
    assert kept and "aten.add.Tensor" in kept[0]["where"] and "divisor" in kept[0]["why"]
    v = compiled.verify(samples=8)
    assert v.ok, v.failures


class SqrtHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 1)
        self.out = nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.sqrt(self.conv(x)))


@pytest.mark.parametrize("target", ["imxrt700", "cortex-m33"])  # a min/max and a histogram observer
def test_a_nan_in_calibration_names_the_sample_node_and_op(target: str) -> None:
    torch.manual_seed(0)
    example, calib = _data(1, 4, 4, 4)
    with pytest.raises(
        EtforgeError, match=r"calibration sample 0: sqrt \(aten\.sqrt\.default\) computes NaN"
    ):
        etforge.compile(SqrtHead().eval(), example, target=target, calibration=calib)


def test_nan_values_in_both_runs_are_the_same_values(tmp_path: Path) -> None:
    """A float model computing NaN (the square root of a negative) gives NaN in model.pte and
    in the Edge program alike: the two runs agree (NaN is not equal to NaN in ``torch.equal``:
    they were reported as differing, blamed on the memory plan)."""
    from support import run_cli

    model = tmp_path / "sqrt_head.py"
    model.write_text(
        "import torch\n"
        "from test_numeric_hazards import SqrtHead, _data\n\n\n"
        "def build():\n"
        "    torch.manual_seed(0)\n"
        "    example, calib = _data(1, 4, 4, 4)\n"
        "    return SqrtHead().eval(), example, calib\n"
    )
    out = tmp_path / "out"
    # in this process (support.run_cli): tests/ is on sys.path (pyproject), so sqrt_head.py imports
    run_cli("compile", f"{model}:build", "--target", "cortex-m33", "--float", "--no-cache", "-o", str(out))
    done = run_cli("verify", str(out), "--samples", "2", "--json")
    pte = json.loads(done.stdout)["pte"]
    assert pte["agreed"] == pte["samples"] == 2, pte
