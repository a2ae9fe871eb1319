"""Unsupported input is refused with a reason; conversion failures name the node and op."""

from __future__ import annotations

import pytest
import torch

from etforge.core import pipeline
from etforge.core.converter import SUPPORTED, OpConverter
from etforge.core.errors import ConversionError
from etforge.core.litert_convert import convert_program
from etforge.core.plugin_manager import registry


def _decisions(
    module: torch.nn.Module, x: tuple[torch.Tensor, ...], target: str, quantize: bool = True
) -> dict[str, str]:
    reg = registry()
    tgt = reg.target(target)
    ep = pipeline.export(module.eval(), x)
    if quantize:
        ep = pipeline.quantize(ep, tgt, [x], reg)
    _, partitioner, _, _ = pipeline.lower(ep, tgt, None, reg)
    return {d.op: d.reason for d in partitioner.decisions if not d.npu}


def test_float_model_refused_on_int8_npu_with_reason() -> None:
    refused = _decisions(torch.nn.Conv2d(3, 4, 3), (torch.randn(1, 3, 5, 5),), "imxrt700", quantize=False)
    assert "float32: the neutron-c NPU runs int8 only" in refused["aten.convolution.default"]


def test_unsupported_shape_is_refused() -> None:
    refused = _decisions(torch.nn.Conv3d(2, 2, 1), (torch.randn(1, 2, 3, 3, 3),), "litert", quantize=False)
    assert "3-D" in refused["aten.convolution.default"]  # the constraint's text, then the culprit


def test_unsupported_attribute_is_refused() -> None:
    pool = torch.nn.AvgPool2d(2, divisor_override=3)
    refused = _decisions(pool, (torch.randn(1, 2, 4, 4),), "litert", quantize=False)
    assert refused["aten.avg_pool2d.default"].endswith(": divisor_override")


def test_neutron_limit_is_refused_with_numbers() -> None:
    big = torch.nn.Conv2d(4096, 4, 5, bias=False)  # 5*5*ceil(4096, 16) = 102400 > 65535
    refused = _decisions(big, (torch.randn(1, 4096, 5, 5),), "imxrt700")
    assert "102400 > 65535" in refused["aten.convolution.default"]


def test_unsupported_dtype_is_refused() -> None:
    class IntAdd(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x.to(torch.int32) + 1).to(torch.float32)

    refused = _decisions(IntAdd(), (torch.randn(1, 4),), "litert", quantize=False)
    assert refused["aten.add.Tensor"] == "int32: the litert NPU runs int8, float32 only"


def test_conversion_failure_names_node_and_op() -> None:
    class Broken(OpConverter):
        ops = ("aten.relu.default",)

        def check(self, node, target):  # noqa: ANN001, ANN201
            return SUPPORTED

        def convert(self, node, ctx):  # noqa: ANN001, ANN201
            raise RuntimeError("cannot handle this layout")

    reg = registry()
    target = reg.target("litert")
    ep = pipeline.export(torch.nn.ReLU(), (torch.randn(1, 3),))
    from executorch.exir import to_edge

    edge_ep = to_edge(ep).exported_program()
    with pytest.raises(
        ConversionError, match=r"node aten_relu_default \(aten.relu.default\): Broken failed: RuntimeError"
    ):
        convert_program(edge_ep, target, {"aten.relu.default": [Broken()]})
    with pytest.raises(
        ConversionError, match=r"aten_relu_default \(aten.relu.default\): no converter plugin handles"
    ):
        convert_program(edge_ep, target, {})
