"""Graph shapes from real models that broke a stage: a factory tensor, an SE gate, 0-d tensors.

``x * torch.ones(...)``: the early path decomposes ``ones`` (a node with no tensor inputs)
in the program's own fake mode. An SE gate ``x * gate`` with ``gate`` [N, C, 1, 1]
broadcast over H x W runs as CMSIS-NN's channel-broadcast ``quantized_mul`` on cortex-m33,
also when the gated map is a channel slice (ghostnet).
A full reduction (``mean()``, ``sum`` over every dim) hands an NPU partition 0-d tensors:
numpy turns those into scalars or [1] arrays unless told not to, and verify crashed.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import etforge
from etforge.core.common.errors import EtforgeError
from etforge.runtime.verification.verify import compare


class MulOnes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x) * torch.ones(1, 8, 1, 1)


class SqueezeExcite(nn.Module):
    """torchvision's SqueezeExcitation form: pool, 1x1 conv, ReLU, 1x1 conv, sigmoid, scale."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc1 = nn.Conv2d(8, 4, 1)
        self.fc2 = nn.Conv2d(4, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.conv(x))
        gate = torch.sigmoid(self.fc2(F.relu(self.fc1(F.adaptive_avg_pool2d(y, 1)))))
        return y * gate


def _compile_and_compare(model: nn.Module, target: str) -> tuple[Any, Any]:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(1, 3, 8, 8, generator=g),) for _ in range(8)]
    c = etforge.compile(model.eval(), calib[0], target, calibration=calib)
    r = c.result
    return c, compare(r.host_program, r.float_program, r.quantized_program, c.report, samples=8)


def test_a_product_with_torch_ones_compiles_and_verifies_on_imxrt700() -> None:
    torch.manual_seed(0)
    c, v = _compile_and_compare(MulOnes(), "imxrt700")
    assert v.ok, v.failures
    assert any(n["op"] == "aten.mul.Tensor" and n["placement"] == "npu" for n in c.report["nodes"])


def test_an_se_gate_broadcast_over_hxw_runs_as_cmsis_nn_mul_on_cortex_m33() -> None:
    torch.manual_seed(0)
    c, v = _compile_and_compare(SqueezeExcite(), "cortex-m33")
    assert v.ok, v.failures
    assert c.report["cpu_ops"].get("cortex_m.quantized_mul.default") == 1


class GhostSqueezeExcite(nn.Module):
    """ghostnet's form: the gated map is a channel slice of a concatenation, a result the
    channels-last export does not keep channels-last."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.cheap = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.fc1 = nn.Conv2d(12, 4, 1)
        self.fc2 = nn.Conv2d(4, 12, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = F.relu(self.conv(x))
        y = torch.cat([a, F.relu(self.cheap(a))], 1)[:, :12]
        return y * torch.sigmoid(self.fc2(F.relu(self.fc1(y.mean((2, 3), keepdim=True)))))


def test_an_se_gate_on_a_channel_slice_runs_as_cmsis_nn_mul_on_cortex_m33() -> None:
    """ExecuTorch's Cortex-M lowering asserted (broadcasting "not yet supported") on a
    contiguous gated map; its codes are now copied channels-last first."""
    c, v = _compile_and_compare(GhostSqueezeExcite(), "cortex-m33")
    assert v.ok, v.failures
    assert c.report["cpu_ops"].get("cortex_m.quantized_mul.default") == 1


class ScalarHead(nn.Module):
    """Two full reductions feed a second partition: its inputs and output are 0-d."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.conv(x))
        return y.mean() + y.amax((1, 2, 3)).sum() * 0.5, y


def test_zero_dim_partition_inputs_verify_on_every_target() -> None:
    g = torch.Generator().manual_seed(0)
    calib = [(torch.randn(1, 3, 8, 8, generator=g),) for _ in range(3)]
    for target in ("imxrt700", "imxrt700cm", "cortex-m33"):
        compiled = etforge.compile(ScalarHead().eval(), calib[0], target=target, calibration=calib)
        # (ExecuTorch's Cortex-M passes give the scalar sum the shape [1]: same value, noted)
        assert compiled.report["outputs"][0]["shape"] == ([] if target == "imxrt700" else [1])
        verification = compiled.verify(samples=2)
        assert verification.ok, (target, verification.failures)


class ConvAffine(nn.Module):
    """A conv and a per-channel weight and bias for a normalization written by hand after it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, 8))
        self.bias = nn.Parameter(torch.linspace(-0.2, 0.2, 8))


class PowLayerNorm(ConvAffine):
    """A channels-first norm over a third moment, ``(x - u).pow(3)`` (EdgeNeXt's reference
    LayerNorm squares, which the ``SquareAsMul`` rewrite now makes a MUL). The float ``pow``
    runs on the CPU's portable kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(3).mean(1, keepdim=True).abs()
        x = (x - u) / torch.sqrt(s + 1e-6)
        return self.weight[:, None, None] * x + self.bias[:, None, None]


def test_a_float_pow_has_the_portable_kernel_on_every_target() -> None:
    """The kernel check asked ExecuTorch's to_out_variant, which refuses every aten::pow (two
    int overloads share a signature), so edgenext failed to compile: "no kernel for
    aten::pow.Tensor_Scalar (no out variant)"; to_executorch itself finds pow's out variant."""
    for target in ("imxrt700", "imxrt700cm", "cortex-m33"):
        c, v = _compile_and_compare(PowLayerNorm(), target)
        assert v.ok, (target, v.failures)
        assert c.report["cpu_ops"].get("aten.pow.Tensor_Scalar") == 1, (target, c.report["cpu_ops"])


class ContextBlocks(nn.Module):
    """An attention-style block under ``autocast(enabled=False)`` (efficientvit's LiteMLA), a
    ``no_grad`` block nested inside it and one beside it."""

    def __init__(self, autocast_cpu: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.proj = nn.Conv2d(8, 8, 1)
        self.device_type = "cpu" if autocast_cpu else "cuda"
        self.enabled = autocast_cpu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.conv(x))
        with torch.autocast(device_type=self.device_type, enabled=self.enabled, dtype=torch.bfloat16):
            z = y * torch.sigmoid(y)
            with torch.no_grad():
                z = self.proj(z) + y
        with torch.no_grad():
            z = F.relu(z)
        return z


def test_autocast_and_no_grad_blocks_compile_and_verify_on_every_target() -> None:
    """export keeps each block as a higher-order op over a submodule; the lowering crashed on
    it ("unexpected KeyError: 'val'"). The blocks' ops now stand in the graph itself."""
    for target in ("imxrt700", "imxrt700cm", "cortex-m33"):
        c, v = _compile_and_compare(ContextBlocks(), target)
        assert v.ok, (target, v.failures)
        assert any("autocast / grad-mode" in n for n in c.report["notes"]), c.report["notes"]
        if target != "cortex-m33":
            assert len(c.report["partitions"]) == 1, target


def test_an_enabled_cpu_autocast_is_refused_naming_the_node() -> None:
    with pytest.raises(
        EtforgeError, match=r"\(wrap_with_autocast\): .*torch\.autocast\('cpu', dtype=torch\.bfloat16\)"
    ):
        _compile_and_compare(ContextBlocks(autocast_cpu=True), "imxrt700")


class GlobalResponseNorm(ConvAffine):
    """timm's GRN (convnextv2): ``x + torch.addcmul(bias, weight, x * x_n)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        x_g = x.norm(p=2, dim=(2, 3), keepdim=True)
        x_n = x_g / (x_g.mean(dim=1, keepdim=True) + 1e-6)
        return x + torch.addcmul(self.bias.view(1, -1, 1, 1), self.weight.view(1, -1, 1, 1), x * x_n)


def test_addcmul_is_split_before_quantization_and_verifies_on_every_target() -> None:
    """to_edge decomposed the unannotated addcmul after quantization, and its products reached
    the NPU with float values between them: "LiteRT refuses its op MUL … FLOAT32 != INT8"."""
    for target in ("imxrt700", "imxrt700cm", "cortex-m33"):
        c, v = _compile_and_compare(GlobalResponseNorm(), target)
        assert v.ok, (target, v.failures)
        assert "FusedMultiplyAdd" in " ".join(c.report["notes"]), c.report["notes"]


class NoOpCast(nn.Module):
    """A constant branch cast to the dtype it already has (edgenext's positional encoding:
    ``pos.to(dtype)``): export keeps an ``_assert_tensor_metadata`` checking float32."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(8, dtype=torch.float32).reshape(1, 8, 1, 1) / 8
        return self.conv(x) + pos.to(self.conv.weight.dtype)


def test_a_no_op_cast_verifies() -> None:
    """verify's float64 evaluation of the quantized program failed the assertion ("Tensor
    dtype mismatch! Expected: Float, Got: double"); the front end now removes it."""
    c, v = _compile_and_compare(NoOpCast(), "imxrt700cm")
    assert v.ok, v.failures
    ops = {str(n.target) for n in c.result.quantized_program.graph.nodes}
    assert "aten._assert_tensor_metadata.default" not in ops
    assert any("_assert_tensor_metadata" in note for note in c.report["notes"])


class ChannelsFirstNorm(nn.Module):
    """Hugging Face's ConvNeXt LayerNorm (channels first): cast to float and back around
    ``(x - u).pow(2).mean(1)`` and ``(x - u) / torch.sqrt(s + eps)``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.weight = nn.Parameter(torch.rand(8) + 0.5)
        self.bias = nn.Parameter(torch.randn(8) * 0.1)
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        dtype = x.dtype
        x = x.float()
        u = x.mean(1, keepdim=True)
        s = (x - u).pow(2).mean(1, keepdim=True)
        x = (x - u) / torch.sqrt(s + 1e-6)
        x = x.to(dtype=dtype)
        return self.head(self.weight[:, None, None] * x + self.bias[:, None, None])


@pytest.mark.parametrize("target", ["imxrt700", "cortex-m33"])
def test_a_hand_written_channels_first_norm_runs_in_one_partition(target: str) -> None:
    """The no-op casts' assertions cut the partition (each one a CPU node reading an NPU
    tensor), and ``pow`` and ``div`` by ``sqrt`` had no NPU op: 4 partitions on imxrt700.
    Now one, with the square a MUL and the division a MUL by RSQRT."""
    torch.manual_seed(0)
    c, v = _compile_and_compare(ChannelsFirstNorm(), target)
    assert v.ok, v.failures
    nodes = c.report["nodes"]
    ops = {n["op"] for n in nodes}
    assert not ops & {"aten.pow.Tensor_Scalar", "aten.sqrt.default", "aten.div.Tensor"}, ops
    if target == "imxrt700":
        assert len(c.report["partitions"]) == 1, [
            (n["op"], n["reason"]) for n in nodes if n["placement"] != "npu"
        ]
        assert all(n["placement"] == "npu" for n in nodes), [
            n["op"] for n in nodes if n["placement"] != "npu"
        ]
