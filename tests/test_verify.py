"""verify's top-1 agreement: ties on an int8 output step are not disagreements."""

from __future__ import annotations

import torch

from etforge.runtime.verify import top1_agrees


def test_top1_counts_a_tie_on_either_side_as_agreement() -> None:
    ref = torch.tensor([[0.25, 0.25, 0.125]])  # the reference cannot tell class 0 from 1
    assert top1_agrees(torch.tensor([[0.25, 0.2578, 0.125]]), ref)
    ours = torch.tensor([[0.5, 0.5, 0.0]])  # ours ties; the reference picks class 1
    assert top1_agrees(ours, torch.tensor([[0.1, 0.3, 0.2]]))


def test_top1_disagreement_is_caught() -> None:
    ref = torch.tensor([[0.25, 0.2578, 0.125], [0.0, 1.0, 0.5]])
    assert top1_agrees(ref, ref)
    flipped = torch.tensor([[0.2578, 0.25, 0.125], [0.0, 1.0, 0.5]])  # row 0: a real 1-step flip
    assert not top1_agrees(flipped, ref)


class _ReluPlusInput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) + x


def _compile_and_compare(*plugins: object) -> object:
    from etforge.core.compiler import compile_model
    from etforge.core.plugin_manager import extra_plugins, registry
    from etforge.core.report import build_report
    from etforge.runtime.verify import compare

    g = torch.Generator().manual_seed(0)
    calib = [(4 * torch.randn(1, 8, 6, 6, generator=g),) for _ in range(4)]
    with extra_plugins(*plugins):
        reg = registry()
        result = compile_model(_ReluPlusInput(), calib[0], "imxrt700", calibration=calib, reg=reg)
        return compare(
            result.host_program,
            result.float_program,
            result.quantized_program,
            build_report(result, reg, "relu_plus_input"),
            samples=4,
        )


def test_every_npu_op_is_checked_on_the_inputs_litert_gave_it() -> None:
    v = _compile_and_compare()
    assert v.ok and v.op_max_steps is not None and v.op_max_steps <= 1  # type: ignore[attr-defined]
    assert v.op_values > 0  # type: ignore[attr-defined]


def test_a_wrong_converter_is_named_by_the_per_op_check() -> None:
    """A plugin that lowers relu to RELU_N1_TO_1 (clamping at 1): the failure names that op."""
    import types

    from etforge.core.converter import elementwise
    from etforge.core.hookspecs import hookimpl

    wrong = types.ModuleType("wrong_relu")
    wrong.etforge_op_converters = hookimpl(  # type: ignore[attr-defined]
        lambda: [elementwise("aten.relu.default", "RELU_N1_TO_1", name="WrongRelu", priority=10)]
    )
    v = _compile_and_compare(wrong)
    assert not v.ok  # type: ignore[attr-defined]
    failure = next(f for f in v.failures if "NPU op" in f)  # type: ignore[attr-defined]
    assert "aten_relu_default" in failure and "from the reference op on the same inputs" in failure


def test_cpu_ops_are_compared_with_the_reference_op_on_the_same_inputs() -> None:
    """cortex-m33: each CMSIS-NN op within a step of its PT2E op; a shifted output offset is seen."""
    from etforge.core.compiler import compile_model
    from etforge.core.pipeline import clone_program
    from etforge.runtime.stepwise import cpu_op_parity

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3)
    ).eval()
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(1, 3, 8, 8, generator=g),) for _ in range(4)]
    result = compile_model(model, calib[0], "cortex-m33", calibration=calib)
    x = (torch.randn(1, 3, 8, 8, generator=g).to(memory_format=torch.channels_last),)
    good = cpu_op_parity(result.host_program, result.quantized_program, x)
    convs = [p for p in good if "quantized_conv2d" in p.node]
    assert len(convs) == 2 and all(p.max_steps <= 1 for p in good)

    broken = clone_program(result.host_program)
    conv = next(n for n in broken.graph.nodes if "quantized_conv2d" in str(n.target))
    args = list(conv.args)
    args[7] = int(args[7]) + 5  # output_offset: every value of this op 5 steps off
    conv.args = tuple(args)
    bad = {p.node: p.max_steps for p in cpu_op_parity(broken, result.quantized_program, x)}
    assert bad[conv.name] >= 4 and all(v <= 1 for k, v in bad.items() if k != conv.name)
