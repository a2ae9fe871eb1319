"""Quantization-aware training as a workflow: ``etforge.qat.prepare`` -> the user's own
training loop -> ``etforge.qat.compile`` (or ExecuTorch's recipe with ``train_fn``).

A small MLP on scikit-learn's digits, a few seeded steps: the compiled program verifies
exactly against its quantized reference, and the recipe's QAT flow (ExecuTorch's QUANTIZE
stage with ``is_qat``) gives the same bytes as the API's, trained the same way.
"""

from __future__ import annotations

import pytest
import torch
from executorch.export import export
from test_idiom import _ops
from torch import nn

import etforge
import etforge.qat as qat
from etforge.core.common.errors import EtforgeError
from etforge.recipes import target_recipe
from etforge.zoo import digits


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


def test_bad_input_is_refused() -> None:
    example = (_data()[0][:1],)
    prepared = qat.prepare(_model(), example, target="imxrt700")
    with pytest.raises(EtforgeError, match="call prepared.eval"):
        qat.compile(prepared, example)
    prepared.eval()
    with pytest.raises(EtforgeError, match=r"prepared for QAT on 'imxrt700', not 'cortex-m33'"):
        qat.compile(prepared, example, target="cortex-m33")
    with pytest.raises(EtforgeError, match="not prepared by etforge.qat.prepare"):
        qat.compile(_model(), example)  # type: ignore[arg-type]
    with pytest.raises(EtforgeError, match="on 'imxrt700': compile it with etforge.qat.compile"):
        etforge.compile(prepared, example, target="imxrt700")
    with pytest.raises(EtforgeError, match=r"on 'imxrt700', not 'imxrt700cm' .*etforge.qat.compile"):
        etforge.compile(prepared, example, target="imxrt700cm")


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
