"""verify's references built at lower cost (issue 47) are the ones built before, bit for bit.

- ``lifted.unlifted``: the graph ``ExportedProgram.module()`` builds (names, ops, arguments,
  metadata, attributes, code) with one code generation; a program with a buffer mutation is
  left to ``module()``.
- ``constant_fold.folded``: a copy of the graph reading the module's own tensors, not a deep
  copy of every weight; its outputs are the deep copy's, and the module's tensors stay as they
  were; a graph with a mutating op is deep-copied as before.
- the float64 reference defers a dequantize read only as a summed conv's input: every output
  leaf the same as computing it.
- ``context.constant_value``: one pass over the input specs, the value the signature's tables
  give, for every kind of placeholder.
- the float check's partition is converted without a second copy: conversion leaves its graph
  as it was, and the float check's results are the ones on a copy.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from support import compiled_architecture, same_leaves


def _structure(gm: torch.fx.GraphModule) -> list[tuple[Any, ...]]:
    def arg(a: Any) -> Any:
        return torch.fx.node.map_arg(a, lambda n: f"%{n.name}")

    return [
        (n.name, n.op, str(n.target), str(arg(n.args)), str(arg(n.kwargs)), sorted(k for k in n.meta if k != "from_node"))
        for n in gm.graph.nodes
    ]  # fmt: skip


CASES = [
    ("shufflenet", "imxrt700cm"),  # chunk, concat, channel shuffle, depthwise, the NPU target
    ("kws_ds", "cortex-m33"),  # depthwise-separable, average pool, the CPU target
    pytest.param("mobilenet_v3_se", "imxrt700cm", marks=pytest.mark.slow),  # hardswish, SE mul, pools
    pytest.param("transformer", "imxrt700cm", marks=pytest.mark.slow),  # layer norm, softmax, matmuls
    pytest.param("squeezenet", "cortex-m33", marks=pytest.mark.slow),  # max pool, concat
    pytest.param("resnet_projection", "imxrt700", marks=pytest.mark.slow),  # residual adds
]


@pytest.mark.parametrize(("name", "target"), CASES)
def test_the_cheaper_references_are_the_ones_built_before(
    name: str, target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import operator

    from etforge.runtime.verification import constant_fold, reference
    from etforge.runtime.verification.constant_nodes import ConstantNodes
    from etforge.runtime.verification.exact_batched import exact_leaves_all
    from etforge.runtime.verification.inputs import seeded_inputs
    from etforge.runtime.verification.lifted import unlifted

    result, report = compiled_architecture(name, target)
    inputs = seeded_inputs(report, 0, 9)
    for ep in (result.quantized_program, result.float_program):
        old, new = ep.module(check_guards=False), unlifted(ep)
        assert new is not None
        assert _structure(new) == _structure(old) and new.code == old.code
        for n in (n for n in old.graph.nodes if n.op == "get_attr"):
            held = operator.attrgetter(str(n.target))
            assert held(new) is held(old)  # the program's own tensors, parameters as parameters
        with torch.no_grad():
            assert all(same_leaves(new(*b), old(*b)) for b in inputs[:3])
    q_fn = unlifted(result.quantized_program)
    assert q_fn is not None
    program = result.host_program
    # the float64 reference: dequantizes read only by summed convs deferred, or all computed
    deferred = exact_leaves_all(program, q_fn, inputs, ConstantNodes(q_fn.graph))
    real = reference.keep_codes

    def nothing_deferred(graph: torch.fx.Graph, last_uses: Any) -> set[Any]:
        real(graph, last_uses)
        return set()

    monkeypatch.setattr(reference, "keep_codes", nothing_deferred)
    computed = exact_leaves_all(program, q_fn, inputs, ConstantNodes(q_fn.graph))
    assert all(same_leaves(a, b) for a, b in zip(deferred, computed, strict=True))
    monkeypatch.undo()
    # the float32 reference: on a graph copy sharing the weights, or on a deep copy
    weights = {k: (v, v.clone()) for k, v in q_fn.state_dict(keep_vars=True).items()}
    shared = constant_fold.folded(q_fn)
    monkeypatch.setattr(constant_fold, "_graph_copy", copy.deepcopy)
    deep = constant_fold.folded(q_fn)
    with torch.no_grad():
        assert all(same_leaves(shared(*b), deep(*b)) for b in inputs)
    after = q_fn.state_dict(keep_vars=True)
    assert all(after[k] is v and torch.equal(v, before) for k, (v, before) in weights.items())


def test_a_program_that_mutates_a_buffer_is_unlifted_and_folded_as_before() -> None:
    """A buffer updated in place: kept in the graph, ``unlifted`` builds ``module()``'s graph;
    as a mutation output, it leaves it to ``module()`` (which inserts the copy back); and a
    copy of a graph with a mutating op is a deep one, so running it never changes the
    original's buffer."""
    from etforge.runtime.verification.constant_fold import _graph_copy, folded
    from etforge.runtime.verification.lifted import unlifted

    class Counter(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("n", torch.zeros(1))
            self.w = torch.nn.Parameter(torch.ones(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.n.add_(1)
            return x * (self.w * 2) + self.n

    x = torch.ones(4)
    ep = torch.export.export(Counter(), (x,))  # the in-place add kept in the graph
    kept = unlifted(ep)
    assert kept is not None and _structure(kept) == _structure(ep.module(check_guards=False))
    functional = ep.run_decompositions({})  # the mutation an output of the program: module() inserts its copy
    assert any(s.kind.name == "BUFFER_MUTATION" for s in functional.graph_signature.output_specs)
    assert unlifted(functional) is None
    gm = copy.deepcopy(ep).module(check_guards=False)
    assert folded(gm) is gm  # an in-place op: no node is folded (``ConstantNodes``), as before
    deep = _graph_copy(gm)  # and a copy of its graph is a deep one
    assert deep.n is not gm.n
    with torch.no_grad():
        deep(x), deep(x)
    assert float(gm.n) == 0.0 and float(deep.n) == 2.0

    class Plain(Counter):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * (self.w * 2) + self.n

    plain = torch.export.export(Plain(), (x,)).module(check_guards=False)
    assert _graph_copy(plain).n is plain.n  # nothing writes it: shared


def test_constant_value_is_the_signature_tables_value() -> None:
    """Every placeholder of a program with parameters, buffers (persistent and not) and a
    lifted constant: the value the signature's three tables name, None for the user input."""
    from etforge.core.litert.context import constant_value

    class Mixed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)
            self.register_buffer("offset", torch.full((1, 4, 1, 1), 0.5), persistent=False)
            self.table = torch.arange(4.0).reshape(1, 4, 1, 1)  # a lifted tensor constant

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.bn(self.conv(x)) + self.offset + self.table

    ep = torch.export.export(Mixed().eval(), (torch.randn(1, 3, 8, 8),))
    sig = ep.graph_signature
    kinds = {s.kind for s in sig.input_specs}
    assert len(kinds) >= 4  # user input, parameter, buffer, constant tensor
    for n in (n for n in ep.graph.nodes if n.op == "placeholder"):
        expected = None
        for table, source in (
            (sig.inputs_to_parameters, ep.state_dict),
            (sig.inputs_to_buffers, ep.state_dict),
            (sig.inputs_to_lifted_tensor_constants, ep.constants),
        ):
            if n.target in table:
                key = table[n.target]
                expected = source.get(key, ep.constants.get(key))
                break
        got = constant_value(ep, n)
        assert (got is None) == (expected is None), n.name
        if expected is not None:
            assert got is not None and got.data_ptr() == expected.data_ptr() and torch.equal(got, expected)


def test_the_float_partition_is_converted_in_place_with_the_same_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stripped partition is converted without a copy: conversion leaves its graph (nodes,
    arguments) and constants as they were, and the float check over four samples gives the
    same ops and errors as converting a copy did."""
    from etforge.core.graph.utils import clone_program
    from etforge.core.registry.manager import registry
    from etforge.runtime.execution.host import run_program
    from etforge.runtime.verification import float_partitions
    from etforge.runtime.verification.float_check import float_target
    from etforge.runtime.verification.inputs import seeded_inputs
    from etforge.runtime.verification.verify import DEVICE_KERNELS, _float_check_in_place

    result, report = compiled_architecture("shufflenet", "imxrt700cm")
    reg = registry()
    target = float_target(reg.target("imxrt700cm"))
    program = result.host_program
    samples: list[list[Any]] = []
    for batch in seeded_inputs(report, 0, 4):
        calls: list[Any] = []
        run_program(program, batch, DEVICE_KERNELS, calls)
        samples.append(list(calls))
    lowered = samples[0][0][0]
    stripped, _ = float_partitions.stripped(lowered.original_module)
    before = (_structure(stripped.graph_module), dict(stripped.state_dict), dict(stripped.constants))
    from etforge.core.litert.convert import convert_program

    convert_program(stripped, target, reg.converters_for(target), name="p", reg=reg)
    after = (_structure(stripped.graph_module), dict(stripped.state_dict), dict(stripped.constants))
    assert [s[:5] for s in before[0]] == [s[:5] for s in after[0]]  # metadata marks only
    assert before[1].keys() == after[1].keys() and all(before[1][k] is after[1][k] for k in before[1])
    assert before[2].keys() == after[2].keys() and all(before[2][k] is after[2][k] for k in before[2])
    in_place, why = _float_check_in_place(samples, target, reg)
    from etforge.core.litert import convert

    monkeypatch.setattr(
        convert, "convert_program", lambda ep, *a, **k: convert_program(clone_program(ep), *a, **k)
    )
    on_copy, why_copy = _float_check_in_place(samples, target, reg)
    assert in_place is not None and on_copy is not None, (why, why_copy)
    assert sorted(map(repr, in_place)) == sorted(map(repr, on_copy)) and len(in_place) > 10
