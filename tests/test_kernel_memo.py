"""model.pte's host kernel calls that repeat the Edge run's byte for byte take their results
(``runtime.execution.kernel_memo``): the same values as computing them, and the .pte = Edge gate
still fails on every case that proves it.

Zoo models on cortex-m33 (CMSIS-NN's kernels on the host): ds_cnn (depthwise convs, average
pooling), resnet8 (residual adds), cifarnet (5x5 convs, max pooling, a linear layer).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from etforge.core.build import output
from etforge.core.build.report import build_report
from etforge.core.build.session import CompileResult, compile_model
from etforge.core.registry.manager import registry
from etforge.plugins.targets import cortex_m_host as K
from etforge.runtime.execution import kernel_memo
from etforge.runtime.execution.host import run_program
from etforge.runtime.execution.pte_interpreter import PteInterpreter
from etforge.runtime.verification.pte_agreement import compare_with_edge

MODELS = ("ds_cnn", "resnet8", "cifarnet")

Compiled = dict[str, tuple[CompileResult, Path]]
#: each model's example inputs' shapes
SHAPES: dict[int, list[tuple[int, ...]]] = {}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Compiled:
    from etforge.zoo import models

    reg = registry()
    out: Compiled = {}
    for name in MODELS:
        torch.manual_seed(0)
        model, calibration = models.build(name)[0], models.calibration(name, 4)
        result = compile_model(model.eval(), calibration[0], "cortex-m33", calibration=calibration, reg=reg)
        d = tmp_path_factory.mktemp(name)
        output.write_outputs(d, result, build_report(result, reg, name))
        out[name] = (result, d)
        SHAPES[id(result)] = [tuple(x.shape) for x in calibration[0]]
    return out


def _inputs(result: CompileResult, count: int) -> list[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(7)
    shapes = SHAPES[id(result)]
    batches = []
    for _ in range(count):
        xs = [torch.randn(s, generator=g) for s in shapes]
        batches.append(tuple(x.to(memory_format=torch.channels_last) if x.dim() == 4 else x for x in xs))
    return batches


def _recorded(result: CompileResult, batches: list[Any]) -> tuple[list[list[Any]], kernel_memo.Store]:
    store = kernel_memo.Store()
    edge = []
    for n, b in enumerate(batches):
        with kernel_memo.recording(store, n):  # sample n's run, for the .pte's run on sample n
            edge.append(run_program(result.host_program, b))
    return edge, store


def _equal(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("name", MODELS)
def test_the_memo_changes_no_value(compiled: Compiled, name: str) -> None:
    """model.pte with the Edge run's calls reused = computed = the Edge run; every call repeats."""
    result, d = compiled[name]
    batches = _inputs(result, 3)
    edge, store = _recorded(result, batches)
    interp = PteInterpreter((d / output.PTE).read_bytes(), str(d / output.PTE))
    computed = [interp.run(b) for b in batches]
    agreement = compare_with_edge(interp, result.host_program, batches, edge_outputs=edge, memo=store)
    assert agreement.ok and agreement.kernel_calls > 0
    # weights' strides and scratch bytes are not read; an activation whose size-1 dim has another
    # stride in the .pte (ds_cnn's one-channel input) is another key: computed
    assert agreement.repeated_calls >= 0.8 * agreement.kernel_calls
    served = []
    for n, b in enumerate(batches):
        with kernel_memo.serving(store, n):
            served.append(interp.run(b))
    for c, s, e in zip(computed, served, edge, strict=True):
        assert _equal(c, s) and _equal(c, e)


@pytest.mark.parametrize("name", MODELS)
def test_the_faster_requantization_changes_no_value(
    compiled: Compiled, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Edge run with the conv kernels' float64/int32 and in-place paths = with ``requantize``'s
    general integer path alone."""
    result, _ = compiled[name]
    batches = _inputs(result, 3)
    fast = [run_program(result.host_program, b) for b in batches]
    monkeypatch.setattr(K, "_finish_exact_float", lambda *a: None)
    monkeypatch.setattr(K, "_requantize_in_place", lambda *a: None)
    general = [run_program(result.host_program, b) for b in batches]
    assert all(_equal(f, g) for f, g in zip(fast, general, strict=True))


def _conv_call(seed: int) -> list[Any]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-128, 128, (1, 8, 6, 6), generator=g, dtype=torch.int8)
    w = torch.randint(-128, 128, (4, 3, 3, 8), generator=g, dtype=torch.int8)
    bias = torch.randint(-500, 500, (4,), generator=g, dtype=torch.int32)
    mult = torch.randint(2**30, 2**31 - 1, (4,), generator=g, dtype=torch.int32)
    shift = torch.full((4,), -9, dtype=torch.int32)
    scratch = torch.randint(0, 256, (64,), generator=g, dtype=torch.uint8)
    x = x.contiguous(memory_format=torch.channels_last)
    return [x, w, bias, [1, 1], [1, 1], [1, 1], 128, -3, mult, shift, -128, 127, scratch]


def _out() -> torch.Tensor:
    return torch.empty((1, 4, 6, 6), dtype=torch.int8).contiguous(memory_format=torch.channels_last)


READS = tuple(
    {"weight": "bytes", "bias": "bytes", "scratch": "unread"}.get(n, "whole")
    for n in (
        "input weight bias stride padding dilation input_offset output_offset "
        "requantize_multipliers requantize_shifts activation_min activation_max scratch"
    ).split()
)


def _served(args: list[Any], store: kernel_memo.Store) -> torch.Tensor:
    with kernel_memo.serving(store):
        return kernel_memo.call(K.quantized_conv2d, args, _out(), READS)


def test_a_call_differing_in_one_byte_or_one_stride_computes() -> None:
    args = _conv_call(0)
    store = kernel_memo.Store()
    with kernel_memo.recording(store):
        recorded = kernel_memo.call(K.quantized_conv2d, args, _out(), READS).clone()

    same = _served([a.clone() if isinstance(a, torch.Tensor) else a for a in args], store)
    assert store.hits == 1 and torch.equal(same, recorded)

    flipped = list(args)
    flipped[0] = args[0].clone()
    flipped[0][0, 3, 2, 2] ^= 1  # one input byte
    direct = K.quantized_conv2d(*flipped, _out())
    assert not torch.equal(direct, recorded)  # a served result would show
    assert torch.equal(_served(flipped, store), direct) and store.hits == 1

    weight = list(args)
    weight[1] = args[1].clone()
    weight[1].view(-1)[5] += 1  # one weight byte (read in memory order)
    assert torch.equal(_served(weight, store), K.quantized_conv2d(*weight, _out())) and store.hits == 1

    laid_out = list(args)
    laid_out[0] = args[0].contiguous()  # the same values in another memory layout
    _served(laid_out, store)
    assert store.hits == 1

    assert not kernel_memo._same(-3.0, -3, "whole")  # the output offset as a float: another call
    assert not kernel_memo._same(0.0, -0.0, "whole")

    scratch = list(args)
    scratch[-1] = torch.zeros(64, dtype=torch.uint8)  # never read: the recorded result holds
    assert torch.equal(_served(scratch, store), recorded)
    assert (store.hits, store.calls) == (2, 5)


def _patched(d: Path, edit: Any) -> PteInterpreter:
    from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

    pte = deserialize_pte_binary((d / output.PTE).read_bytes())
    edit(pte.program)
    return PteInterpreter(bytes(serialize_pte_binary(pte)), "patched.pte")


def _conv_instructions(program: Any) -> list[Any]:
    plan = program.execution_plan[0]
    names = [op.name for op in plan.operators]
    return [
        ins.instr_args
        for ins in plan.chains[0].instructions
        if hasattr(ins.instr_args, "op_index")
        and names[ins.instr_args.op_index] == "cortex_m::quantized_conv2d"
    ]


def test_a_changed_weight_still_fails_the_gate_with_the_memo(compiled: Compiled) -> None:
    from executorch.exir import schema

    result, d = compiled["resnet8"]

    def edit(program: Any) -> None:
        plan = program.execution_plan[0]
        weight = plan.values[_conv_instructions(program)[1].args[1]].val
        assert isinstance(weight, schema.Tensor) and weight.data_buffer_idx > 0
        buffer = program.constant_buffer[weight.data_buffer_idx]
        buffer.storage = bytes(b ^ 0x40 for b in buffer.storage)

    batches = _inputs(result, 2)
    edge, store = _recorded(result, batches)
    agreement = compare_with_edge(
        _patched(d, edit), result.host_program, batches, edge_outputs=edge, memo=store
    )
    assert not agreement.ok and agreement.agreed == 0
    assert "cortex_m::quantized_conv2d.out, Edge node" in (agreement.first_difference or "")
    assert agreement.repeated_calls < agreement.kernel_calls  # the changed conv and what follows computed


def test_a_changed_instruction_argument_still_fails_the_gate_with_the_memo(compiled: Compiled) -> None:
    from executorch.exir import schema

    result, d = compiled["ds_cnn"]

    def edit(program: Any) -> None:
        plan = program.execution_plan[0]
        conv = _conv_instructions(program)[0]
        out_offset = 7  # input, weight, bias, stride, padding, dilation, input_offset, output_offset
        plan.values.append(
            schema.EValue(schema.Int(int_val=plan.values[conv.args[out_offset]].val.int_val + 5))
        )
        conv.args[out_offset] = len(plan.values) - 1

    batches = _inputs(result, 2)
    edge, store = _recorded(result, batches)
    agreement = compare_with_edge(
        _patched(d, edit), result.host_program, batches, edge_outputs=edge, memo=store
    )
    assert not agreement.ok and agreement.agreed == 0
    assert agreement.repeated_calls < agreement.kernel_calls


def test_verify_counts_and_tells_the_reused_calls(compiled: Compiled) -> None:
    """Through ``verify``: the .pte = Edge gate holds, the calls reused are counted, and the ones
    computed (ds_cnn's one-channel input: another stride on a size-1 dim) are told."""
    from etforge.runtime.verification.verify import verify

    _, d = compiled["ds_cnn"]
    v = verify(d, samples=2)
    assert v.pte is not None and v.pte.ok
    assert 0 < v.pte.repeated_calls < v.pte.kernel_calls
    told = [n for n in v.notes if n.startswith("model.pte: ") and "host kernel calls computed" in n]
    assert len(told) == 1 and f"of {v.pte.kernel_calls} host kernel calls" in told[0], v.notes
