"""The device simulation of several samples in one pass (``runtime.verification.simulate_batched``)
computes, bit for bit, what ``simulate`` computes for each sample alone: every output, every
recorded rule and torch value, the values without a rule and those left to torch — on
programs with per-channel and depthwise convolutions, pooling, softmax and table (LUT) ops,
NPU partitions and CPU (CMSIS-NN, portable) ops. ``verify`` gives the same figures with the
batched pass as without it, and a batched pass that differs from the per-sample one is told
and not used."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch


class _Patches(torch.nn.Module):
    """MobileViT's unfold (timm's ``MobileVitBlock``): 2x2 patches become the rows of a
    layer-normed transformer input, a reshape of a transposed view, then folded back: per
    sample the normed values are laid out transposed, so a reduction over them sums in
    another memory order than over the stacked samples' (contiguous) reshape."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 64, 3, padding=1)
        self.mlp = torch.nn.Linear(64, 64)
        self.head = torch.nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        b, c, h, w = y.shape
        y = y.reshape(b * c * (h // 2), 2, w // 2, 2).transpose(1, 2)
        y = y.reshape(b, c, (h // 2) * (w // 2), 4).transpose(1, 3).reshape(b * 4, (h // 2) * (w // 2), c)
        d = y - y.mean(-1, keepdim=True)  # a layer norm as timm's blocks reach the graph: means
        y = y + self.mlp(d * torch.rsqrt((d * d).mean(-1, keepdim=True) + 1e-5))
        y = (
            y.contiguous()
            .view(b, 4, (h // 2) * (w // 2), c)
            .transpose(1, 3)
            .reshape(b * c * (h // 2), w // 2, 2, 2)
        )
        y = y.transpose(1, 2).reshape(b, c, h, w)
        return self.head(y.mean((2, 3)))


def _built(name: str) -> tuple[torch.nn.Module, list[tuple[torch.Tensor, ...]]]:
    from models.architectures import build

    if name == "patches":
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(1)
        return _Patches().eval(), [(torch.randn(1, 3, 32, 32, generator=g),) for _ in range(4)]
    if name == "mobilenet_v2_96":
        from etforge.zoo import models

        return models.build(name)[0], models.calibration(name, 4)
    model, _, calibration = build(name)
    return model, calibration


def _compiled(name: str, target: str) -> tuple[Any, Any]:
    from etforge.core.build.report import build_report
    from etforge.core.build.session import compile_model
    from etforge.core.registry.manager import registry

    model, calibration = _built(name)
    reg = registry()
    result = compile_model(model.eval(), calibration[0], target, calibration=calibration, reg=reg)
    return result, build_report(result, reg, name)


def _cases(result: Any, report: Any, samples: int) -> tuple[Any, list[Any], list[Any], list[Any]]:
    """(the PT2E module, per sample: inputs, kinds, program values) as ``verify`` builds them."""
    from etforge.runtime.execution import litert_run
    from etforge.runtime.execution.host import run_program
    from etforge.runtime.verification import exact_pass
    from etforge.runtime.verification.inputs import seeded_inputs
    from etforge.runtime.verification.stepwise import DEVICE_KERNELS, HostInt8Values, observer_names

    q_fn = result.quantized_program.module(check_guards=False)
    aliases = observer_names(result.quantized_program)
    inputs = seeded_inputs(report, 0, samples)
    kinds, program_values, kept = [], [], {}
    for batch in inputs:
        calls: list[Any] = []
        values = HostInt8Values(aliases)
        with litert_run.keeping(DEVICE_KERNELS, kept):
            run_program(result.host_program, batch, DEVICE_KERNELS, calls, values)
            npu = exact_pass.litert_values(calls)
        kinds.append(values.kinds(q_fn))
        program_values.append({**npu, **values.values(q_fn)})
    return q_fn, inputs, kinds, program_values


CASES = [
    ("patches", "cortex-m33"),  # MobileViT's unfold: samples of 4 rows each, laid out transposed
    # 32 samples: batching torch's float convolutions changes some recorded values here
    pytest.param("mobilenet_v2_96", "imxrt700cm", marks=pytest.mark.slow),
    ("mobilenet_v3_se", "imxrt700cm"),  # depthwise, per-channel, hardswish / hardsigmoid, average pools
    ("shufflenet", "imxrt700cm"),  # chunk, concat, channel shuffle (views that name the batch)
    ("transformer", "imxrt700cm"),  # layer norm, softmax, GELU, matmuls: NPU and CPU ops
    pytest.param("kws_ds", "cortex-m33", marks=pytest.mark.slow),  # CMSIS-NN depthwise, average pool
    pytest.param("transformer", "cortex-m33", marks=pytest.mark.slow),  # CMSIS-NN table ops, portable ops
    pytest.param("squeezenet", "cortex-m33", marks=pytest.mark.slow),  # ceil-mode max pool, concat
    pytest.param("multi_io", "imxrt700", marks=pytest.mark.slow),  # two inputs, two outputs
]


@pytest.mark.parametrize(("name", "target"), CASES)
def test_batched_simulation_equals_each_sample_alone(name: str, target: str) -> None:
    from etforge.runtime.verification.constant_nodes import ConstantNodes
    from etforge.runtime.verification.sample_pass import difference
    from etforge.runtime.verification.simulate import simulate
    from etforge.runtime.verification.simulate_batched import simulate_batched

    result, report = _compiled(name, target)
    q_fn, inputs, kinds, program_values = _cases(
        result, report, 32 if name in ("mobilenet_v2_96", "patches") else 5
    )
    assert all(k == kinds[0] for k in kinds)
    seen: list[dict[str, Any]] = [{} for _ in inputs]
    batched = simulate_batched(q_fn, inputs, kinds[0], program_values, seen, ConstantNodes(q_fn.graph))
    constants = ConstantNodes(q_fn.graph)
    for i, batch in enumerate(inputs):
        alone: dict[str, Any] = {}
        one = simulate(q_fn, batch, kinds[i], program_values[i], alone, constants)
        assert difference(one, alone, batched.samples[i], seen[i]) == "", f"sample {i}"
        assert alone  # the records compared are there
    assert batched.stacked > 0  # the pass computed values once for all samples: not a per-sample loop
    calls = sum(1 for n in q_fn.graph.nodes if n.op == "call_function")
    assert len(batched.per_sample) < calls


def test_the_check_tells_a_batched_pass_that_differs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A batched pass whose first sample is off by one code in one output value: verify says
    so, simulates one sample at a time, and its figures are those of the per-sample run."""
    from etforge.core.build.pipeline import clone_program
    from etforge.runtime.verification import sample_pass
    from etforge.runtime.verification.verify import compare

    result, report = _compiled("kws_ds", "imxrt700cm")

    def run() -> Any:
        float_ep, qep = clone_program(result.float_program), clone_program(result.quantized_program)
        return compare(result.host_program, float_ep, qep, report, samples=4)

    good = run()
    assert good.sim_batched_samples == 4 and good.sim_batched_passes == 1 and good.ok
    real = sample_pass.simulate_batched

    def off_by_one(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        first = out.samples[0].outputs[0]
        first.view(-1)[0] += 1 if first.dtype == torch.int8 else 1e-3
        return out

    monkeypatch.setattr(sample_pass, "simulate_batched", off_by_one)
    told = run()
    assert told.sim_batched_samples == 0 and told.sim_batched_passes == 0
    assert any("ran one sample at a time" in n and "an output" in n for n in told.notes)
    assert [n for n in told.notes if "one sample at a time" not in n] == good.notes
    fields = {f.name for f in dataclasses.fields(good)} - {
        "seconds", "notes", "sim_batched_samples", "sim_batched_passes", "sim_per_sample_nodes", "pte",
    }  # fmt: skip
    for f in sorted(fields):
        assert getattr(told, f) == getattr(good, f), f


@pytest.mark.slow
def test_verify_figures_are_those_of_the_per_sample_simulation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The transformer on imxrt700cm (NPU and CPU ops, ops without a rule), 6 samples in two
    chunks: every figure of ``compare`` equals the one-sample-at-a-time run's."""
    from etforge.core.build.pipeline import clone_program
    from etforge.runtime.verification import sample_pass, verify
    from etforge.runtime.verification.verify import compare

    result, report = _compiled("transformer", "imxrt700cm")

    def run() -> Any:
        float_ep, qep = clone_program(result.float_program), clone_program(result.quantized_program)
        return compare(result.host_program, float_ep, qep, report, samples=6)

    monkeypatch.setattr(verify, "chunk_size", lambda module: 3)
    batched = run()
    assert batched.sim_batched_samples == 6 and batched.sim_batched_passes == 2
    monkeypatch.setattr(verify, "BatchState", lambda: sample_pass.BatchState(note="per sample"))
    alone = run()
    assert alone.sim_batched_samples == 0
    assert batched.ok and batched.samples_from_simulation == 5
    assert alone.notes[:-1] == batched.notes and alone.notes[-1] == "per sample"
    skip = {"seconds", "notes", "sim_batched_samples", "sim_batched_passes", "sim_per_sample_nodes", "pte"}
    for f in dataclasses.fields(batched):
        if f.name not in skip:
            assert getattr(batched, f.name) == getattr(alone, f.name), f.name


def test_the_folded_reference_computes_what_the_program_does() -> None:
    """``constant_fold.folded``: the weights' dequantizes computed once, the float32 run's
    outputs equal to the program's, structure and values, and the program left as it was."""
    from etforge.runtime.verification.constant_fold import folded
    from etforge.runtime.verification.inputs import seeded_inputs

    result, report = _compiled("mobilenet_v3_se", "imxrt700cm")
    q_fn = result.quantized_program.module(check_guards=False)
    before = [n.name for n in q_fn.graph.nodes]
    ref = folded(q_fn)
    assert [n.name for n in q_fn.graph.nodes] == before
    per_channel = [n for n in ref.graph.nodes if "dequantize_per_channel" in str(n.target)]
    assert per_channel == [] and any("dequantize_per_channel" in str(n.target) for n in q_fn.graph.nodes)
    with torch.no_grad():
        for batch in seeded_inputs(report, 0, 3):
            a, b = q_fn(*batch), ref(*batch)
            assert type(a) is type(b)
            flat_a, spec_a = torch.utils._pytree.tree_flatten(a)
            flat_b, spec_b = torch.utils._pytree.tree_flatten(b)
            assert spec_a == spec_b and all(torch.equal(x, y) for x, y in zip(flat_a, flat_b, strict=True))


class _Unfold(torch.nn.Module):
    """MobileViT's unfold, then a mean over the channels: per sample the reshape is a view
    whose channels are strided; over stacked samples it is a copy, channels contiguous."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        y = x.reshape(b * c * (h // 2), 2, w // 2, 2).transpose(1, 2)
        y = y.reshape(b, c, (h // 2) * (w // 2), 4).transpose(1, 3).reshape(b * 4, (h // 2) * (w // 2), c)
        return y.mean(-1, keepdim=True)


def test_a_float_reduction_per_sample_reads_its_input_laid_out_as_traced() -> None:
    """A float op the batched pass runs per sample gets each sample's input with the strides
    the per-sample run has: a mean over strided channels sums in another order than over
    contiguous ones (float32: last bits differ), and the outputs must be the same bits."""
    from etforge.runtime.verification.simulate import simulate
    from etforge.runtime.verification.simulate_batched import simulate_batched

    g = torch.Generator().manual_seed(0)
    inputs = [(torch.randn(1, 64, 32, 32, generator=g),) for _ in range(4)]
    module = torch.export.export(_Unfold(), inputs[0]).module()
    batched = simulate_batched(module, inputs)
    assert batched.stacked > 0 and "mean" in batched.per_sample  # reshapes stacked, the mean per sample
    for i, batch in enumerate(inputs):
        alone = simulate(module, batch)
        assert torch.equal(alone.outputs[0], batched.samples[i].outputs[0]), f"sample {i}"
