"""The quantized program built from PT2E's converted graph (core/graph/program.py) is the
program ``torch.export`` gives when it re-traces that graph: same code, signature, values and
serialized bytes. Every expectation here comes from torch's own re-export, not from the code
under test.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from executorch.exir.passes.remove_unused_parameters_pass import remove_unused_parameters_pass
from torch import nn

from etforge.core.build import pipeline
from etforge.core.build.session import compile_model
from etforge.core.graph import program as program_from_graph
from etforge.core.graph.program import Unsupported, as_dispatched
from etforge.core.registry.manager import registry


class _Block(nn.Module):
    """conv+BN+ReLU6, a residual add, ceil-mode and plain average pooling, a BatchNorm1d
    that PT2E leaves unfused (a multi-output op and its getitem), and a linear head. Two
    attributes are spelled as TensorFlow ports spell them (torchvision's inception_v3
    ``Conv2d_1a_3x3``): torch.export lower-cases their placeholders' names and targets."""

    def __init__(self) -> None:
        super().__init__()
        self.Conv2d_1a = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 1)
        self.fc = nn.Linear(8 * 5 * 5, 6)
        self.BN_1d = nn.BatchNorm1d(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu6(self.bn(self.Conv2d_1a(x)))
        y = y + self.conv2(y)
        y = F.avg_pool2d(y, 3, stride=2, ceil_mode=True)
        y = F.avg_pool2d(y, 2, stride=1)
        return self.BN_1d(self.fc(torch.flatten(y, 1)))


def _converted(target: str) -> tuple[torch.fx.GraphModule, torch.export.ExportedProgram, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    model = _Block().eval()
    g = torch.Generator().manual_seed(1)
    example = (torch.randn(1, 3, 12, 12, generator=g),)
    reg = registry()
    tgt = reg.target(target)
    ep, _ = pipeline.rewrite(torch.export.export(model, example, strict=False), tgt, reg)
    gm = pipeline.prepare(ep.module(check_guards=False), pipeline.quantizer_for(tgt, None, reg))
    with torch.no_grad():
        for _ in range(3):
            gm(torch.randn(1, 3, 12, 12, generator=g))
    return pipeline.convert(gm), ep, example


@pytest.mark.parametrize("target", ["imxrt700", "imxrt700cm", "cortex-m33"])
def test_program_is_the_one_reexport_gives(target: str) -> None:
    gm, ep, example = _converted(target)
    ours = program_from_graph.program_from_graph(gm, ep, example)
    theirs = torch.export.export(gm, example, strict=False)
    assert ours.graph_module.code == theirs.graph_module.code
    assert str(ours.graph_signature) == str(theirs.graph_signature)
    holders = [[(n.name, n.target) for n in p.graph.find_nodes(op="placeholder")] for p in (ours, theirs)]
    assert holders[0] == holders[1]
    assert list(ours.state_dict) == list(theirs.state_dict)
    assert all(ours.state_dict[k] is theirs.state_dict[k] for k in ours.state_dict)
    for a, b in zip(ours.graph.nodes, theirs.graph.nodes, strict=True):
        va, vb = a.meta.get("val"), b.meta.get("val")
        assert type(va) is type(vb), a.name
        if isinstance(va, torch.Tensor):
            assert (va.shape, va.dtype, va.stride()) == (vb.shape, vb.dtype, vb.stride()), a.name
    with torch.no_grad():
        assert torch.equal(ours.module()(*example), theirs.module()(*example))
    remove_unused_parameters_pass(ours)  # finds each parameter's placeholder by its target


def test_compile_bytes_equal_the_reexport_route(monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = _Block().eval()
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(1, 3, 12, 12, generator=g),) for _ in range(3)]
    direct = compile_model(model, calib[0], "imxrt700cm", calibration=calib)

    def refuse(*args: object) -> None:
        raise Unsupported("re-export, for comparison")

    monkeypatch.setattr(program_from_graph, "program_from_graph", refuse)
    reexported = compile_model(model, calib[0], "imxrt700cm", calibration=calib)
    assert direct.pte == reexported.pte
    assert [p.processed for p in direct.partitions] == [p.processed for p in reexported.partitions]


def test_quantized_program_keeps_no_unused_float_weights() -> None:
    """PT2E folds each weight into an int8 constant; the float original stays in the converted
    module's state, unused, and must not ride along through lowering and quantized.pt2."""
    gm, ep, example = _converted("imxrt700")
    float_bytes = sum(t.numel() * t.element_size() for t in ep.state_dict.values())
    reg = registry()
    quantized = pipeline.quantize(ep, reg.target("imxrt700"), [example], reg)
    holders = {n.name: n for n in quantized.graph.nodes if n.op == "placeholder"}
    params = [s for s in quantized.graph_signature.input_specs if s.kind.name == "PARAMETER"]
    assert all(holders[s.arg.name].users for s in params)
    kept = sum(t.numel() * t.element_size() for t in quantized.state_dict.values())
    assert kept < float_bytes  # int8 weights and the float biases, not the float weights


def _recorded(op: torch._ops.OpOverload, *args: object, **kwargs: object) -> torch.fx.Node:
    """The node ``torch.export`` records for ``op`` called with these arguments."""

    class Call(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return op(x, *args, **kwargs)

    ep = torch.export.export(Call(), (torch.randn(1, 4, 6, 6),), strict=False)
    (node,) = [n for n in ep.graph.nodes if n.op == "call_function"]
    return node


@pytest.mark.parametrize(
    "op, args, kwargs",
    [
        (torch.ops.aten.avg_pool2d.default, ([3, 3], (1, 1), [0, 0], 0, 0), {}),  # ints for bools
        (torch.ops.aten.avg_pool2d.default, ([2, 2], [2, 2], [0, 0], False, True, None), {}),  # defaults
        (torch.ops.aten.mean.dim, ((2, 3),), {"keepdim": 1}),  # a positional argument by keyword
        (torch.ops.aten.hardtanh.default, (0, 6), {}),  # Scalars keep their type
        (torch.ops.aten.leaky_relu.default, (1,), {}),
        (torch.ops.aten.sum.dim_IntList, ([1],), {"keepdim": False, "dtype": None}),  # kwarg-only default
    ],
)
def test_arguments_are_normalized_as_the_dispatcher_records_them(
    op: torch._ops.OpOverload, args: tuple[object, ...], kwargs: dict[str, object]
) -> None:
    node = _recorded(op, *args, **kwargs)
    ours_args, ours_kwargs = as_dispatched(op, ("x", *args), kwargs)
    assert ours_args[1:] == node.args[1:]
    assert [_kind(a) for a in ours_args[1:]] == [_kind(a) for a in node.args[1:]]
    assert ours_kwargs == dict(node.kwargs)


def _kind(value: object) -> object:
    """A value's type, and its elements' (torch.fx stores lists as its immutable_list)."""
    if isinstance(value, (list, tuple)):
        return ("list", tuple(_kind(v) for v in value))
    return type(value)


def test_arguments_the_schema_lacks_are_refused() -> None:
    with pytest.raises(Unsupported, match="does not have"):
        as_dispatched(torch.ops.aten.relu.default, ("x",), {"inplace": True})
    with pytest.raises(Unsupported, match="without its argument 'kernel_size'"):
        as_dispatched(torch.ops.aten.avg_pool2d.default, ("x",), {})


class _Counting(nn.Module):
    """Counts its calls in a buffer: the program mutates its state."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        return self.fc(x)


class _WithConstant(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.offset = torch.arange(4.0)  # neither a parameter nor a buffer: a lifted constant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + self.offset


def _quantized_both_ways(
    model: nn.Module,
) -> tuple[object, torch.export.ExportedProgram, tuple[torch.Tensor]]:
    example = (torch.randn(1, 4, generator=torch.Generator().manual_seed(2)),)
    ep = torch.export.export(model.eval(), example, strict=False)
    reg = registry()
    gm = pipeline.prepare(
        ep.module(check_guards=False), pipeline.quantizer_for(reg.target("imxrt700"), None, reg)
    )
    gm(*example)
    gm = pipeline.convert(gm)
    try:
        direct: object = program_from_graph.program_from_graph(gm, ep, example)
    except Unsupported as exc:
        direct = exc
    return direct, torch.export.export(gm, example, strict=False), example


def test_a_graph_outside_its_shape_is_refused_and_quantize_reexports() -> None:
    torch.manual_seed(0)
    refused, reexported, example = _quantized_both_ways(_Counting())
    assert isinstance(refused, Unsupported)  # the in-place add_ on the buffer
    reg = registry()
    torch.manual_seed(0)
    ep = torch.export.export(_Counting().eval(), example, strict=False)
    quantized = pipeline.quantize(ep, reg.target("imxrt700"), [example], reg)
    expected = remove_unused_parameters_pass(reexported)  # quantize drops the folded float weights
    assert quantized.graph_module.code == expected.graph_module.code


def test_a_float_constant_pt2e_folded_is_no_obstacle() -> None:
    """The float program lifts ``offset`` as a constant; PT2E folds it, so the converted
    graph holds parameters and buffers only and the direct construction applies."""
    torch.manual_seed(0)
    direct, reexported, example = _quantized_both_ways(_WithConstant())
    assert isinstance(direct, torch.export.ExportedProgram)
    assert direct.graph_module.code == reexported.graph_module.code
    assert str(direct.graph_signature) == str(reexported.graph_signature)


class _Rewritten(nn.Module):
    """A channel shuffle, a split and a hardsigmoid: the graph rewrites change all three."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 1)
        self.gate = nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        a, b = y.chunk(2, dim=1)
        y = torch.cat([a, self.gate(b)], dim=1)
        n, c, h, w = y.shape
        return y.view(n, 2, c // 2, h, w).transpose(1, 2).reshape(n, c, h, w)


@pytest.mark.parametrize("target", ["imxrt700", "cortex-m33"])
def test_rewritten_float_program_is_the_one_reexport_gives(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rewrite stage builds its program the same way, not by re-exporting."""
    example = (torch.randn(1, 3, 6, 6),)
    reg = registry()
    tgt = reg.target(target)
    ep = torch.export.export(_Rewritten().eval(), example, strict=False)
    ours, applied = pipeline.rewrite(ep, tgt, reg)
    assert applied, "the rewrites must change this graph"

    def refuse(*args: object) -> None:
        raise Unsupported("re-export, for comparison")

    monkeypatch.setattr(program_from_graph, "program_from_graph", refuse)
    theirs, again = pipeline.rewrite(ep, tgt, reg)
    assert again == applied
    assert ours.graph_module.code == theirs.graph_module.code
    assert str(ours.graph_signature) == str(theirs.graph_signature)
    for a, b in zip(ours.graph.nodes, theirs.graph.nodes, strict=True):
        va, vb = a.meta.get("val"), b.meta.get("val")
        if isinstance(va, torch.Tensor):
            assert (va.shape, va.dtype, va.stride()) == (vb.shape, vb.dtype, vb.stride()), a.name
    with torch.no_grad():
        assert torch.equal(ours.module()(*example), theirs.module()(*example))
