"""verify's top-1 agreement: ties on an int8 output step are not disagreements."""

from __future__ import annotations

import torch

from etforge.runtime.verification.outputs import top1_agrees


def test_top1_counts_a_tie_on_either_side_as_agreement() -> None:
    ref = torch.tensor([[0.25, 0.25, 0.125]])  # the reference cannot tell class 0 from 1
    assert top1_agrees(torch.tensor([[0.25, 0.2578, 0.125]]), ref)
    ours = torch.tensor([[0.5, 0.5, 0.0]])  # ours ties; the reference picks class 1
    assert top1_agrees(ours, torch.tensor([[0.1, 0.3, 0.2]]))


def test_top1_disagreement_is_caught() -> None:
    ref = torch.tensor([[0.25, 0.2578, 0.125], [0.0, 1.0, 0.5]])
    # other values, no ties, the same top class in every row: agreement is on classes, not values
    assert top1_agrees(torch.tensor([[0.0, 0.5, 0.25], [0.25, 0.75, 0.5]]), ref)
    flipped = torch.tensor([[0.2578, 0.25, 0.125], [0.0, 1.0, 0.5]])  # row 0: a real 1-step flip
    assert not top1_agrees(flipped, ref)
    last = torch.tensor([[0.25, 0.2578, 0.125], [0.0, 0.5, 1.0]])  # every row counts, the last too
    assert not top1_agrees(last, ref)


class _ReluPlusInput(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) + x


def _compile_and_compare(*plugins: object, min_top1: int | None = None) -> object:
    from etforge.core.build.report import build_report
    from etforge.core.build.session import compile_model
    from etforge.core.registry.manager import extra_plugins, registry
    from etforge.runtime.verification.verify import compare

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
            min_top1=min_top1,
        )


def test_every_npu_op_is_checked_on_the_inputs_litert_gave_it() -> None:
    v = _compile_and_compare()
    assert v.ok and v.op_max_steps is not None and v.op_max_steps <= 1  # type: ignore[attr-defined]
    assert v.op_values > 0  # type: ignore[attr-defined]


def test_a_top1_miss_with_every_op_close_says_so() -> None:
    v = _compile_and_compare(min_top1=5)  # more than 4 samples: cannot be met
    assert [f for f in v.failures if "top-1" in f and "not a conversion error" in f]  # type: ignore[attr-defined]


def test_cpu_ops_are_compared_with_the_reference_op_on_the_same_inputs() -> None:
    """cortex-m33: each CMSIS-NN op equals its reference in CMSIS-NN's arithmetic on the same
    inputs (0 values off); a shifted output offset is seen at that op only."""
    from etforge.core.build.pipeline import clone_program
    from etforge.core.build.session import compile_model
    from etforge.runtime.verification.stepwise import cpu_op_parity

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
    assert len(convs) == 2 and all(p.device_exact and p.elements_off == 0 for p in good), good

    broken = clone_program(result.host_program)
    conv = next(n for n in broken.graph.nodes if "quantized_conv2d" in str(n.target))
    args = list(conv.args)
    args[7] = int(args[7]) + 5  # output_offset: every value of this op 5 steps off
    conv.args = tuple(args)
    bad = {p.node: p.max_steps for p in cpu_op_parity(broken, result.quantized_program, x)}
    assert bad[conv.name] == 5 and all(v == 0 for k, v in bad.items() if k != conv.name)


def _attr(module: torch.nn.Module, node: torch.fx.Node) -> torch.Tensor:
    return getattr(module, str(node.target))


def test_the_reference_in_float64_is_the_exact_quantized_value() -> None:
    """An 8192-wide int8 linear: the float64 evaluation equals the integer computation done
    here exactly; torch's float32 evaluation of the same program misses it on some values
    (which is why verify reports the reference's own precision)."""
    from etforge.core.build.session import compile_model
    from etforge.runtime.verification.reference import run_float64

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    calib = [(torch.randn(256, 8192, generator=g),) for _ in range(2)]
    result = compile_model(torch.nn.Linear(8192, 128), calib[0], "imxrt700", calibration=calib)
    q = result.quantized_program.module()  # type: ignore[attr-defined]
    linear = next(n for n in q.graph.nodes if "linear" in str(n.target))
    qout = next(iter(linear.users))
    xdq, wdq, bdq = linear.args
    s_x, zp_x = xdq.args[1], xdq.args[2]
    w, s_w = _attr(q, wdq.args[0]).long(), _attr(q, wdq.args[1]).double()
    b, s_b = _attr(q, bdq.args[0]).long(), _attr(q, bdq.args[1]).double()
    s_out, zp_out = qout.args[1], qout.args[2]
    exact_off = float32_off = 0
    for _ in range(8):
        x = 3 * torch.randn(256, 8192, generator=g)
        xq = (torch.round(x.double() / s_x) + zp_x).clamp(-128, 127).long()
        acc = (xq - zp_x) @ w.T  # exact integers
        y = acc.double() * s_x * s_w + b.double() * s_b
        yq = (torch.round(y / s_out) + zp_out).clamp(-128, 127)
        expected = ((yq - zp_out) * s_out).float()
        exact_off += int((run_float64(q, (x,))[0] != expected).sum())
        with torch.no_grad():
            float32_off += int((q(x) != expected).sum())
    assert exact_off == 0
    assert float32_off > 0  # 14 of 262,144 values here


def test_a_sample_leaves_no_interpreter_behind() -> None:
    """Each sample's LiteRT interpreters (every tensor preserved) sit in reference cycles: with
    the collector's runs rare (the CLI's tuning), 32 samples of vgg11_bn's held 22 GB and the
    kernel killed ``verify``. ``compare`` collects them after each sample."""
    import gc

    from ai_edge_litert.interpreter import Interpreter

    from etforge.core.build.report import build_report
    from etforge.core.build.session import compile_model
    from etforge.core.registry.manager import registry
    from etforge.runtime.verification.verify import compare

    g = torch.Generator().manual_seed(0)
    calib = [(4 * torch.randn(1, 8, 6, 6, generator=g),) for _ in range(4)]
    result = compile_model(_ReluPlusInput(), calib[0], "imxrt700", calibration=calib)
    report = build_report(result, registry(), "relu_plus_input")
    args = (result.host_program, result.float_program, result.quantized_program, report)

    def alive() -> int:
        return sum(isinstance(o, Interpreter) for o in gc.get_objects())

    def growth(samples: int) -> int:
        gc.collect()
        gc.disable()  # no collection but compare's own
        try:
            before = alive()
            assert compare(*args, samples=samples).ok
            return alive() - before
        finally:
            gc.enable()

    compare(*args, samples=1)  # caches filled (the host run keeps one interpreter per partition)
    # what the float check keeps is bounded (FLOAT_CHECK_SAMPLES), whatever the sample count
    assert growth(4) == growth(8)
