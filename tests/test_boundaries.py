"""NPU partitions beside Cortex-M code: NHWC buffers handed over as they are, no layout round trips.

Models are forced to split with ``operators_not_to_delegate`` so NPU partitions and CMSIS-NN
ops alternate; the LiteRT partitions and the lowered program are then inspected for every
transpose or dim-order copy, and the serialized ``.pte`` for the dim orders the delegate
calls really pass.
"""

from __future__ import annotations

from functools import cache

import pytest
import torch
from ai_edge_litert.interpreter import Interpreter

from etforge import zoo
from etforge.core.build.session import CompileResult, compile_model
from etforge.core.common.errors import EtforgeError
from etforge.core.graph import layout
from etforge.core.graph.utils import node_op
from etforge.core.lower.boundaries import check_delegate_dim_orders, layout_conversions
from etforge.core.registry.manager import registry
from etforge.runtime.execution.host import run_program

SPLITS = {
    # three NPU convolutions, each followed by a CMSIS-NN max pool, then the NPU classifier
    "cifarnet": "aten.max_pool2d_with_indices.default",
    # residual adds on the Cortex-M: NPU branches meet on the CPU and fork again
    "resnet8": "aten.add.Tensor",
}


@cache
def _split(name: str, dim_order: str = "channels_last") -> CompileResult:
    model, example = zoo.build(name)
    options = {"operators_not_to_delegate": (SPLITS[name],), "dim_order": dim_order}
    return compile_model(model, example, "imxrt700cm", calibration=zoo.calibration(name, 4), options=options)


def _inputs(name: str, channels_last: bool) -> tuple[torch.Tensor, ...]:
    _, example = zoo.build(name)
    g = torch.Generator().manual_seed(7)
    xs = tuple(torch.randn(t.shape, generator=g) for t in example)
    return tuple(x.to(memory_format=torch.channels_last) for x in xs) if channels_last else xs


def _transposes(result: CompileResult) -> list[tuple[str, int]]:
    return [
        (p.name, i)
        for p in result.partitions
        for i, op in enumerate(p.converted.operators)
        if op == "TRANSPOSE"
    ]


def _ops(result: CompileResult) -> list[str]:
    return [node_op(n) for n in result.host_program.graph.nodes if n.op == "call_function"]


def _delegate_args(result: CompileResult, part: object) -> list[torch.fx.Node]:
    gm = result.host_program.graph_module
    for n in result.host_program.graph.nodes:
        if n.op == "call_function" and n.target is torch.ops.higher_order.executorch_call_delegate:
            if bytes(getattr(gm, str(n.args[0].target)).processed_bytes) == part.processed:  # type: ignore[attr-defined]
                return list(n.args[1:])
    raise AssertionError("partition not called")


def _assert_matches_reference(result: CompileResult, xs: tuple[torch.Tensor, ...]) -> None:
    out = run_program(result.host_program, xs)[0]
    ref = result.quantized_program.module()(*xs)  # type: ignore[union-attr]
    out_node = next(n for n in result.host_program.graph.nodes if n.op == "output").args[0][0]
    step = float(out_node.args[1])
    assert float((out - ref).abs().max()) <= 2.001 * step


@pytest.mark.parametrize("name", sorted(SPLITS))
def test_forced_split_has_no_layout_conversion_between_npu_and_cortex_m(name: str) -> None:
    result = _split(name)
    ops = _ops(result)
    cmsis = [op for op in ops if op.startswith("cortex_m.quantized_")]
    assert len(result.partitions) >= 3 and len(cmsis) >= 2, "the model must really alternate NPU and CPU"
    assert _transposes(result) == []
    assert layout_conversions(result.host_program, registry().cpu_backend(result.target).layout_ops) == []
    four_d = [
        (p.name, tuple(o))
        for p in result.partitions
        for o in p.converted.input_dim_orders + p.converted.output_dim_orders
        if len(o) == 4
    ]
    assert four_d and all(o == (0, 2, 3, 1) for _, o in four_d), four_d
    for p in result.partitions:
        # the LiteRT model itself reads NHWC buffers: its input shapes are the stored shapes
        interp = Interpreter(model_content=p.converted.tflite)
        logical = [tuple(a.meta["val"].shape) for a in _delegate_args(result, p)]
        stored = [layout.apply(s, o) for s, o in zip(logical, p.converted.input_dim_orders, strict=True)]
        assert [tuple(d["shape"]) for d in interp.get_input_details()] == stored
    _assert_matches_reference(result, _inputs(name, channels_last=True))


def _requantizations(result: CompileResult) -> list[str]:
    """Quantize nodes fed by a dequantize, in the quantized program (where the quantizers meet,
    before the Cortex-M passes fold Q/DQ into ops) and in the lowered one: a tensor quantized twice."""
    return [
        n.name
        for program in (result.quantized_program, result.host_program)
        for n in program.graph.nodes
        if n.op == "call_function"
        and "quantize_per_tensor" in node_op(n)
        and "dequantize" not in node_op(n)
        and isinstance(n.args[0], torch.fx.Node)
        and "dequantize_per_tensor" in node_op(n.args[0])
    ]


def test_no_requantization_where_npu_and_cpu_quantizers_meet() -> None:
    """Each tensor crossing between the NPU rules and the Cortex-M quantizer is quantized once."""
    result = _split("cifarnet")
    assert _requantizations(result) == []
    assert sum("cortex_m.quantize_per_tensor" in op for op in _ops(result)) == 1  # the model input


def test_the_input_conversion_is_quantized_once_and_joins_the_npu() -> None:
    """contiguous: the layout copy at the input (observed by the Cortex-M quantizer) and the
    NPU convolution after it share one quantization, so they form one partition."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU()).eval()
    g = torch.Generator().manual_seed(0)
    calib = [(torch.randn(1, 3, 8, 8, generator=g),) for _ in range(4)]
    result = compile_model(
        model, calib[0], "imxrt700cm", calibration=calib, options={"dim_order": "contiguous"}
    )
    assert _requantizations(result) == []
    assert [p.converted.operators[:2] for p in result.partitions] == [["TRANSPOSE", "CONV_2D"]]
    _assert_matches_reference(result, calib[1])


def test_nchw_user_tensors_are_converted_once_at_the_input() -> None:
    result = _split("cifarnet", "contiguous")
    first = result.partitions[0]
    # one TRANSPOSE, inside the NPU (int8), straight off the model's NCHW input
    assert _transposes(result) == [(first.name, 0)]
    assert first.converted.input_dim_orders == [(0, 1, 2, 3)]
    assert layout_conversions(result.host_program, registry().cpu_backend(result.target).layout_ops) == []
    later = [o for p in result.partitions[1:] for o in p.converted.input_dim_orders if len(o) == 4]
    assert later and all(o == (0, 2, 3, 1) for o in later), later  # the CPU pools hand NHWC on
    x = next(n for n in result.host_program.graph.nodes if n.op == "placeholder" and n.name == "x")
    assert x.meta["val"].is_contiguous()
    _assert_matches_reference(result, _inputs("cifarnet", channels_last=False))


def test_the_pte_passes_delegates_the_dim_orders_they_were_built_for() -> None:
    result = _split("cifarnet")
    right = [
        (
            p.name,
            [list(d) for d in p.converted.input_dim_orders],
            [list(d) for d in p.converted.output_dim_orders],
        )
        for p in result.partitions
    ]
    check_delegate_dim_orders(result.pte, right)
    nchw = [(n, [list(range(len(d))) for d in i], o) for n, i, o in right]
    with pytest.raises(EtforgeError, match=r"partition etforge_\d+: the program lays out its I/O"):
        check_delegate_dim_orders(result.pte, nchw)


def test_portable_fallback_keeps_nchw_partition_io() -> None:
    """Portable kernels work in NCHW: on imxrt700 the partitions take and give NCHW."""
    model, example = zoo.build("cifarnet")
    result = compile_model(
        model,
        example,
        "imxrt700",
        calibration=zoo.calibration("cifarnet", 2),
        options={"operators_not_to_delegate": (SPLITS["cifarnet"],)},
    )
    orders = [
        o for p in result.partitions for o in p.converted.input_dim_orders + p.converted.output_dim_orders
    ]
    assert len(result.partitions) == 4 and all(o == tuple(range(len(o))) for o in orders)
    _assert_matches_reference(result, _inputs("cifarnet", channels_last=False))


def test_an_nchw_exported_program_on_a_cortex_m_target_is_noted() -> None:
    """A .pt2 was exported by the user: etforge cannot change its layout, so it says so."""
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
    x = (torch.randn(1, 3, 8, 8),)
    nchw = torch.export.export(model, x)
    result = compile_model(None, x, "imxrt700cm", program=nchw, calibration=[x])
    assert any("NCHW 4-D inputs (input)" in n for n in result.notes)
    cl = tuple(t.to(memory_format=torch.channels_last) for t in x)
    nhwc = torch.export.export(model.to(memory_format=torch.channels_last), cl)
    assert compile_model(None, cl, "imxrt700cm", program=nhwc, calibration=[cl]).notes == []


class _UpsamplingPool(torch.nn.Module):
    """AlexNet's classifier head at a small input: ``adaptive_avg_pool2d`` from 1x1 up to
    6x6 has no NPU form, so a portable pool sits between two NPU partitions."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 36, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv(x)), 8)
        return self.fc(torch.flatten(torch.nn.functional.adaptive_avg_pool2d(x, (6, 6)), 1))


def test_a_portable_pool_between_partitions_keeps_their_dim_orders() -> None:
    """``to_executorch`` copies a channels-last pool input to contiguous and keeps the
    contiguous result (ExecuTorch's LegalizePortableDimOrderPass): the next partition, built
    for channels-last, was then handed NCHW bytes, and the compile failed its dim-order check.
    ``dim_orders.align`` now runs such a pool on a contiguous copy itself, its result copied
    back to channels-last."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    calibration = [(torch.randn(1, 3, 8, 8, generator=g),) for _ in range(4)]
    result = compile_model(_UpsamplingPool().eval(), calibration[0], "imxrt700cm", calibration=calibration)
    assert len(result.partitions) == 2
    assert result.partitions[1].converted.input_dim_orders[0] == (0, 2, 3, 1)
    _assert_matches_reference(result, _inputs_like(calibration[0]))


def _inputs_like(example: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(7)
    return tuple(torch.randn(t.shape, generator=g).to(memory_format=torch.channels_last) for t in example)
