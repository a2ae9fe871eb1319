"""Fake-quantize specs for a quantizer that only has post-training observers.

A CPU backend's quantizer (ExecuTorch's CMSIS-NN quantizer) annotates with observers
(``MinMaxObserver``, ``HistogramObserver``, ``PerChannelMinMaxObserver``); under
``prepare_qat_pt2e`` those nodes would be observed in training but not rounded, so QAT
would not see the int8 arithmetic the device runs there. :class:`FakeQuantizing` keeps the
quantizer's scheme (dtype, range, per-tensor / per-channel, symmetric) and swaps each
observer for a fake-quantize module of the same kind with a moving-average observer, as
etforge's own rules do in QAT (``core.quantize.quantizer.int8_specs``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torchao.quantization.pt2e.fake_quantize import (
    FakeQuantize,
    FakeQuantizeBase,
    FusedMovingAvgObsFakeQuantize,
)
from torchao.quantization.pt2e.observer import (
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
)
from torchao.quantization.pt2e.quantizer import QuantizationSpec, Quantizer

ANNOTATION_KEY = "quantization_annotation"
#: Smallest scale, as the rules' QAT specs.
EPS = 2**-12


def fake_quant_ctr(spec: QuantizationSpec) -> Any:
    """The fake-quantize constructor for ``spec``'s scheme (moving-average statistics)."""
    ctr = spec.observer_or_fake_quant_ctr
    inner = getattr(getattr(ctr, "p", None), "func", ctr)
    if isinstance(inner, type) and issubclass(inner, FakeQuantizeBase):
        return ctr  # already fake-quantizes
    if spec.qscheme in (torch.per_channel_symmetric, torch.per_channel_affine):
        return FakeQuantize.with_args(
            observer=MovingAveragePerChannelMinMaxObserver, ch_axis=spec.ch_axis, eps=EPS
        )
    return FusedMovingAvgObsFakeQuantize.with_args(observer=MovingAverageMinMaxObserver, eps=EPS)


def _swap(spec: Any) -> Any:
    if type(spec) is not QuantizationSpec:  # shared, derived (bias), fixed: no observer of their own
        return spec
    return dataclasses.replace(spec, observer_or_fake_quant_ctr=fake_quant_ctr(spec))


class FakeQuantizing(Quantizer):  # type: ignore[misc]
    """``inner``'s annotations with fake-quantize specs (for ``prepare_qat_pt2e``)."""

    def __init__(self, inner: Quantizer) -> None:
        super().__init__()
        self.inner = inner

    def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        return self.inner.transform_for_annotation(model)

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        before = {n: n.meta.get(ANNOTATION_KEY) for n in model.graph.nodes}
        self.inner.annotate(model)
        for node in model.graph.nodes:
            ann = node.meta.get(ANNOTATION_KEY)
            if ann is None or ann is before.get(node):
                continue
            ann.input_qspec_map = {k: _swap(v) for k, v in ann.input_qspec_map.items()}
            ann.output_qspec = _swap(ann.output_qspec)
        return model

    def validate(self, model: torch.fx.GraphModule) -> None:
        return self.inner.validate(model)
