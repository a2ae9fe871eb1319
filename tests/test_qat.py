"""Quantization-aware training as a workflow: ``etforge.qat.prepare`` -> the user's own
training loop -> ``etforge.qat.compile`` (or ExecuTorch's recipe with ``train_fn``).

A small MLP on scikit-learn's digits, a few seeded steps: the compiled program verifies
exactly against its quantized reference, and the recipe's QAT flow (ExecuTorch's QUANTIZE
stage with ``is_qat``) gives the same bytes as the API's, trained the same way.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from executorch.export import export
from test_idiom import _ops
from torch import nn

import etforge
import etforge.qat as qat
from etforge.core.common.errors import EtforgeError
from etforge.recipes import target_recipe
from etforge.runtime.verification.verify import verify
from etforge.zoo import digits

#: The issue's bound for int8 on the digits (as tests/test_accuracy.py): one point of top-1.
MAX_DROP = 1.0


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    x, y, _, _ = digits.split()
    return x[:256], y[:256]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10)).eval()


def _train(module: torch.nn.Module) -> None:
    """The user's loop: a few seeded SGD steps."""
    x, y = _data()
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    for i in range(0, len(y), 32):
        opt.zero_grad()
        nn.functional.cross_entropy(module(x[i : i + 32]), y[i : i + 32]).backward()
        opt.step()


def test_prepare_train_compile_verifies() -> None:
    model = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    example = (_data()[0][:1],)
    prepared = qat.prepare(model, example, target="imxrt700")
    fake, _ = qat.qat_coverage(prepared)
    assert fake > 0  # the NPU rules' specs fake-quantize in training
    _train(prepared)
    prepared.eval()
    compiled = qat.compile(prepared, example, target="imxrt700")
    assert compiled.report["macs"]["npu_share"] == 1.0
    check = compiled.verify(samples=8)
    assert check.ok, check.failures
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # the caller's model


def test_recipe_qat_is_the_apis_program() -> None:
    """ExecuTorch's QAT flow (``train_fn``) with etforge's recipe: the API's bytes."""
    example = (_data()[0][:1],)
    torch.manual_seed(1)
    prepared = qat.prepare(_model(), example, target="imxrt700")
    _train(prepared)
    prepared.eval()
    api = qat.compile(prepared, example).pte
    torch.manual_seed(1)
    recipe = target_recipe("imxrt700", train_fn=_train)
    assert export(_model(), [example], recipe).get_pte_buffer() == api


def _fit(module: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float) -> None:
    order = torch.Generator().manual_seed(0)
    opt = torch.optim.Adam(module.parameters(), lr=lr)
    for _ in range(epochs):
        perm = torch.randperm(len(y), generator=order)
        for i in range(0, len(y), 64):
            idx = perm[i : i + 64]
            opt.zero_grad()
            nn.functional.cross_entropy(module(x[idx]), y[idx]).backward()
            opt.step()


@pytest.mark.slow  # outside the fast tier: training on real data (issue 47)
def test_qat_keeps_accuracy_on_real_data(tmp_path: Path) -> None:
    """The workflow as docs/qat.md runs it on the digits' training split (a float model trained,
    then fine-tuned with fake quantization, seeded), measured as ``verify --data`` measures it:
    the compiled program's top-1 on the 360 held-out digits, in the device's arithmetic, within
    MAX_DROP of the fine-tuned float model. (No PTQ-vs-QAT claim here: on these data int8 PTQ
    loses under a point; bench/qat.py measures both.)"""
    x, y, _, _ = digits.split()
    example = (x[:1],)
    model = _model().train()
    _fit(model, x, y, 20, 1e-2)
    prepared = qat.prepare(model.eval(), example, target="imxrt700cm")
    _fit(prepared, x, y, 2, 1e-3)
    prepared.eval()
    out = qat.compile(prepared, example).save(tmp_path / "out")
    result = verify(out, samples=4, data="zoo:digits_mlp", max_accuracy_drop=MAX_DROP)
    assert result.ok, result.failures
    assert result.float_accuracy is not None and result.float_accuracy >= 90.0  # it learned the digits
    assert result.compiled_accuracy is not None
    assert result.compiled_accuracy >= result.float_accuracy - MAX_DROP


def test_bad_input_is_refused() -> None:
    example = (_data()[0][:1],)
    prepared = qat.prepare(_model(), example, target="imxrt700")
    with pytest.raises(EtforgeError, match="call prepared.eval"):
        qat.compile(prepared, example)
    prepared.eval()
    with pytest.raises(EtforgeError, match=r"prepared for QAT on 'imxrt700', not 'cortex-m33'"):
        qat.compile(prepared, example, target="cortex-m33")
    with_bn = nn.Sequential(nn.Linear(64, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 10)).eval()
    with pytest.raises(EtforgeError, match=r"give a training batch, 2 or more samples, as example"):
        qat.prepare(with_bn, example, target="imxrt700")
    with pytest.raises(EtforgeError, match="not prepared by etforge.qat.prepare"):
        qat.compile(_model(), example)  # type: ignore[arg-type]
    with pytest.raises(EtforgeError, match="on 'imxrt700': compile it with etforge.qat.compile"):
        etforge.compile(prepared, example, target="imxrt700")
    with pytest.raises(EtforgeError, match=r"on 'imxrt700', not 'imxrt700cm' .*etforge.qat.compile"):
        etforge.compile(prepared, example, target="imxrt700cm")


@pytest.mark.slow  # outside the fast tier: training (issue 47)
def test_cpu_quantizer_fake_quantizes_in_training() -> None:
    """On cortex-m33 every node is CMSIS-NN's quantizer's, which has PTQ observers only: in
    QAT they become fake-quantize modules of the same scheme, and the result verifies."""
    example = (_data()[0][:1],)
    prepared = qat.prepare(_model(), example, target="cortex-m33")
    fake, observed = qat.qat_coverage(prepared)
    assert (fake, observed) == (5, 0)  # input, 2 weights, hidden, output (biases: derived)
    _train(prepared)
    prepared.eval()
    compiled = qat.compile(prepared, example)
    assert "cortex_m::quantized_linear.out" in _ops(compiled.pte)
    check = compiled.verify(samples=8)
    assert check.ok, check.failures
