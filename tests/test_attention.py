"""An attention block (``F.scaled_dot_product_attention``) compiles, verifies and codegens.

On the NPU targets the ``ScaledDotProductAttention`` rewrite spells an unmasked SDPA as
matmul, softmax and matmul (``plugins/rewrites/attention.py``). On cortex-m33 SDPA
decomposes to, among others, ``full_like`` (the attention mask's fill), whose portable
kernel ExecuTorch declares with an empty dispatch table; the registration generator must
build an entry for it (and for every other kernel the libraries provide), and the
generated C++ must compile against the executorch wheel's headers.
"""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import etforge
from etforge.codegen.kernels import catalogue
from etforge.codegen.registration import build_entry
from etforge.runtime.verification.verify import compare

TARGETS = ("imxrt700", "imxrt700cm", "cortex-m33")
INCLUDE = Path(sysconfig.get_paths()["purelib"]) / "executorch" / "include"
C10 = INCLUDE / "executorch" / "runtime" / "core" / "portable_type" / "c10"


class EncoderLayer(nn.Module):
    """A tiny pre-norm transformer encoder layer: 2 heads of 16, sequence 16, width 32."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(32, 96)
        self.proj = nn.Linear(32, 32)
        self.norm1 = nn.LayerNorm(32)
        self.norm2 = nn.LayerNorm(32)
        self.ff = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).reshape(b, s, 3, 2, 16).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.ff(self.norm2(x))


@pytest.fixture(scope="module")
def compiled() -> dict[str, Any]:
    torch.manual_seed(0)
    model = EncoderLayer().eval()
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(1, 16, 32, generator=g),) for _ in range(8)]
    return {t: etforge.compile(model, calib[0], t, calibration=calib) for t in TARGETS}


@pytest.mark.parametrize("target", TARGETS)
def test_attention_compiles_and_verifies(compiled: dict[str, Any], target: str) -> None:
    c = compiled[target]
    r = c.result
    v = compare(r.host_program, r.float_program, r.quantized_program, c.report, samples=8)
    assert v.ok, v.failures


def test_every_library_kernel_has_a_registration_entry() -> None:
    """``full_like.out`` (empty dispatch), ``rand.out`` / ``native_dropout.out`` (seeded tags)."""
    entries = {op: build_entry(k) for op, k in catalogue().items()}
    full_like = entries["aten::full_like.out"]
    assert full_like.call.startswith("torch::executor::native::full_like_out(context, ")
    assert "std::optional<torch::executor::MemoryFormat> memory_format" in full_like.declaration
    assert {"aten::rand.out", "aten::randn.out", "aten::native_dropout.out"} <= set(entries)


def _compile_cpp(cxx: list[str], gen: Path, tmp_path: Path) -> None:
    main = tmp_path / "main.cpp"
    header = next(gen.glob("*.h")).name
    main.write_text(
        f'#include "{header}"\nint etforge_init() {{ return static_cast<int>(etforge_model::register_kernels()); }}\n'
    )
    for src in [*gen.glob("*.cpp"), main]:
        cmd = [*cxx, "-std=c++17", "-Wall", "-Werror", "-c", f"-I{INCLUDE}", f"-I{C10}", f"-I{gen}",
               "-DC10_USING_CUSTOM_GENERATED_MACROS", str(src), "-o", str(tmp_path / (src.stem + ".o"))]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"


@pytest.mark.parametrize("target", ["imxrt700", "cortex-m33"])
def test_the_attention_registration_compiles(compiled: dict[str, Any], target: str, tmp_path: Path) -> None:
    gen = tmp_path / "gen"
    result = compiled[target].codegen(gen)
    assert not result.missing
    if target == "cortex-m33":  # SDPA's own decomposition (the rewrite is for NPU targets)
        assert "aten::full_like.out" in result.registered
    _compile_cpp(["g++"], gen, tmp_path)
    arm = shutil.which("arm-none-eabi-g++")
    if arm is not None:
        _compile_cpp([arm, "-mcpu=cortex-m33", "-mthumb", "-DETFORGE_ALLOW_HOST_ONLY"], gen, tmp_path)


@pytest.mark.parametrize("target", ("imxrt700", "imxrt700cm"))
def test_unmasked_attention_runs_on_the_npu(compiled: dict[str, Any], target: str) -> None:
    """The rewritten attention joins the rest of the block in one NPU partition (41.5 % of
    the MACs on the NPU before the rewrite: the decomposition's guard stayed float). On
    imxrt700 each 4-D matmul decomposes after quantization to expand, clone, view, bmm and
    view: the moves carry int8 codes (``mark_moved_codes``), so the bmm is int8 too (before,
    the chain stayed float on the CPU between partitions)."""
    report = compiled[target].report
    assert len(report["partitions"]) == 1, [
        (n["op"], n["reason"]) for n in report["nodes"] if n["placement"] != "npu"
    ]
    assert report["macs"]["npu_share"] == 1.0
    assert "ScaledDotProductAttention" in " ".join(report.get("notes", []))


class Variants(nn.Module):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        self.kwargs = kwargs

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, **self.kwargs)


@pytest.mark.parametrize(
    ("kwargs", "rewritten"),
    [
        ({}, True),
        ({"scale": 0.3}, True),
        ({"is_causal": True}, False),
        ({"dropout_p": 0.0, "is_causal": False}, True),
    ],
)
def test_the_rewrite_computes_what_sdpa_computes(kwargs: dict[str, Any], rewritten: bool) -> None:
    """Float outputs equal (up to float rounding) SDPA's; causal attention is left whole."""
    from etforge.core.contracts.rewrite import annotate_values
    from etforge.plugins.rewrites.attention import ScaledDotProductAttention

    g = torch.Generator().manual_seed(0)
    qkv = tuple(torch.randn(1, 2, 8, 4, generator=g) for _ in range(3))
    gm = torch.export.export(Variants(**kwargs), qkv, strict=False).module(check_guards=False)
    annotate_values(gm, qkv)
    target = etforge.core.registry.manager.registry().target("imxrt700")
    assert ScaledDotProductAttention().apply(gm, target) is rewritten
    gm.graph.eliminate_dead_code()
    gm.recompile()
    left = [n for n in gm.graph.nodes if n.target is torch.ops.aten.scaled_dot_product_attention.default]
    assert bool(left) is not rewritten
    torch.testing.assert_close(gm(*qkv), F.scaled_dot_product_attention(*qkv, **kwargs), rtol=1e-5, atol=1e-6)


def test_a_masked_attention_is_left_whole() -> None:
    from etforge.plugins.rewrites.attention import ScaledDotProductAttention

    class Masked(nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    args = (*(torch.randn(1, 2, 8, 4) for _ in range(3)), torch.zeros(8, 8))
    gm = torch.export.export(Masked(), args, strict=False).module(check_guards=False)
    target = etforge.core.registry.manager.registry().target("imxrt700")
    assert ScaledDotProductAttention().apply(gm, target) is False


class MultiheadBlock(nn.Module):
    """``nn.MultiheadAttention``: its packed in-projection is split by ``select`` and its SDPA
    spelled as 4-D matmuls (to_edge: ``expand`` + ``view`` + ``bmm``)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 32)
        self.attn = nn.MultiheadAttention(32, 4, batch_first=True)
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        a, _ = self.attn(h, h, h, need_weights=False)
        return self.head(self.norm(h + a).mean(1))


@pytest.mark.parametrize("target", TARGETS)
def test_multihead_attention_compiles_and_verifies(target: str) -> None:
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(1, 8, 16, generator=g),) for _ in range(8)]
    c = etforge.compile(MultiheadBlock().eval(), calib[0], target, calibration=calib)
    nodes = c.report["nodes"]
    if target != "cortex-m33":  # q, k and v picked out of the in-projection on the NPU
        selects = [n for n in nodes if n["op"].startswith("aten.select")]
        assert len(selects) == 3 and all(n["placement"] == "npu" for n in selects), selects
    if target != "cortex-m33":  # the bmm after expand + view is int8 too (mark_moved_codes)
        assert len(c.report["partitions"]) == 1, [
            (n["op"], n["reason"]) for n in nodes if n["placement"] != "npu"
        ]
    r = c.result
    v = compare(r.host_program, r.float_program, r.quantized_program, c.report, samples=8)
    assert v.ok, v.failures


class TransposedKeys(nn.Module):
    """Heads as hand-written attention spells them: one tensor permuted two ways (``q`` and
    its transpose ``k^T``), both read by matmuls after a reshape."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = x.view(1, 8, 2, 8).transpose(1, 2)
        s = torch.softmax(torch.matmul(q, q.transpose(-1, -2)), -1)
        return torch.matmul(s, q).transpose(1, 2).reshape(1, 8, 16)


@pytest.mark.parametrize("target", ["imxrt700", "imxrt700cm"])
def test_two_permutes_of_one_tensor_get_their_own_transposes(target: str) -> None:
    """A permute moves no data (it relabels its input's tensor): two permutes of one tensor
    each need their own TRANSPOSE before a reshape. One cached by tensor and layout alone fed
    ``k^T``'s reshape ``q``'s bytes (max error 4.1 on this model)."""
    from etforge.testing import check_op

    torch.manual_seed(0)
    result = check_op(TransposedKeys().eval(), (torch.randn(1, 8, 16),), target, quantize=False,
                      expect_delegated=False)  # fmt: skip
    assert "TRANSPOSE" in result.litert_ops and result.delegated  # the permutes ran in LiteRT


class ViewedHeads(nn.Module):
    """Hugging Face's ViT self-attention: heads permuted out of a linear, SDPA, then
    ``permute(0, 2, 1, 3).contiguous().view(...)``. SDPA's output follows its query's layout,
    so ``torch.export`` drops the ``contiguous()`` as a no-op and the ``view`` depends on SDPA's
    strides, which the matmuls replacing it do not have."""

    def __init__(self, masked: bool = False) -> None:
        super().__init__()
        self.qkv = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))
        self.out = nn.Linear(16, 16)
        # an additive mask that masks something: SDPA is left to its decomposition
        self.register_buffer("mask", torch.linspace(-1.0, 0.0, 64).reshape(1, 1, 8, 8) if masked else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (p(x).view(1, 8, 2, 8).permute(0, 2, 1, 3) for p in self.qkv)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)
        return self.out(a.permute(0, 2, 1, 3).contiguous().view(1, 8, 16))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("masked", [False, True])
def test_a_view_of_sdpas_strides_compiles_and_verifies(target: str, masked: bool) -> None:
    """Unmasked, the SDPA rewrite's matmuls must keep SDPA's strides for the view; masked, the
    decomposition's do, and verify's interpreters must hand the view values in those strides."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(1, 8, 16, generator=g),) for _ in range(8)]
    c = etforge.compile(ViewedHeads(masked).eval(), calib[0], target, calibration=calib)
    nodes = c.report["nodes"]
    assert masked or not any("scaled_dot_product" in n["op"] for n in nodes)
    if target != "cortex-m33" and not masked:
        assert len(c.report["partitions"]) == 1, [
            (n["op"], n["reason"]) for n in nodes if n["placement"] != "npu"
        ]
    r = c.result
    v = compare(r.host_program, r.float_program, r.quantized_program, c.report, samples=8)
    assert v.ok, v.failures


def test_a_replacement_keeps_the_replaced_values_strides_only_where_a_view_needs_them() -> None:
    """``sdk.replace`` adds the layout copy for a view that needs it, and nothing otherwise."""
    from etforge.core.contracts.rewrite import annotate_values
    from etforge.plugins.rewrites.attention import ScaledDotProductAttention

    class Plain(nn.Module):  # the output is only added to: no view depends on its strides
        def forward(self, q: torch.Tensor) -> torch.Tensor:
            h = q.view(1, 8, 2, 8).permute(0, 2, 1, 3)
            return F.scaled_dot_product_attention(h, h, h) + 1

    target = etforge.core.registry.manager.registry().target("imxrt700")
    for model, copies in ((ViewedHeads().eval(), 1), (Plain(), 0)):
        x = (torch.randn(1, 8, 16),)
        gm = torch.export.export(model, x, strict=False).module(check_guards=False)
        annotate_values(gm, x)
        assert ScaledDotProductAttention().apply(gm, target)
        gm.graph.eliminate_dead_code()
        gm.recompile()
        clones = [n for n in gm.graph.nodes if n.target is torch.ops.aten.clone.default]
        assert len(clones) == copies, type(model).__name__
        torch.testing.assert_close(gm(*x), model(*x), rtol=1e-5, atol=1e-6)


class UnpaddedEncoder(nn.Module):
    """A Hugging Face encoder exported without a padding mask: it builds one from
    ``torch.ones`` (additive, ``(1 - mask) * finfo.min``: all zeros) and hands SDPA that."""

    def __init__(self) -> None:
        super().__init__()
        self.heads = ViewedHeads()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = torch.ones(x.shape[0], x.shape[1])
        mask = (1.0 - keep[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        q, k, v = (p(x).view(1, 8, 2, 8).permute(0, 2, 1, 3) for p in self.heads.qkv)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.expand(1, 2, 8, 8))
        return self.heads.out(a.permute(0, 2, 1, 3).contiguous().view(1, 8, 16))


def test_a_constant_mask_that_masks_nothing_is_dropped_and_the_attention_takes_the_npu() -> None:
    """The decomposition's fully-masked-row guard (eq, logical_not, any, where) kept HF BERT's
    attention float on the CPU (88.9 % of its MACs on the NPU, 5 partitions)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(1, 8, 16, generator=g),) for _ in range(8)]
    c = etforge.compile(UnpaddedEncoder().eval(), calib[0], "imxrt700", calibration=calib)
    nodes = c.report["nodes"]
    assert all(n["placement"] == "npu" for n in nodes), [
        (n["op"], n["reason"]) for n in nodes if n["placement"] != "npu"
    ]
    assert len(c.report["partitions"]) == 1
    r = c.result
    v = compare(r.host_program, r.float_program, r.quantized_program, c.report, samples=8)
    assert v.ok, v.failures
