"""verify's references at lower cost (issue 47) compute what they computed before.

The float32 reference fuses each quantize / dequantize round trip into the same float32
operations without the int8 casts (``constant_fold.round_trip``): its outputs bit for bit.

The float64 reference sums a conv / linear of int8 values as integers where that is provably
exact (``runtime.verification.exact_sums``): each value the same to float64 rounding, and
every output leaf verify's gates read (top-1 and steps against the exact value) bit for bit
the one torch's float64 ops give, on programs with per-channel and depthwise convolutions,
pooling, softmax / table ops, concat, residual adds, linear layers, NPU and CPU targets.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch


def _compiled(name: str, target: str) -> Any:
    from models.architectures import build

    from etforge.core.build.report import build_report
    from etforge.core.build.session import compile_model
    from etforge.core.registry.manager import registry

    model, _, calibration = build(name)
    reg = registry()
    result = compile_model(model.eval(), calibration[0], target, calibration=calibration, reg=reg)
    return result, build_report(result, reg, name)


CASES = [
    ("mobilenet_v3_se", "imxrt700cm"),  # depthwise, per-channel, hardswish / hardsigmoid, average pools
    ("shufflenet", "imxrt700cm"),  # chunk, concat, channel shuffle, depthwise
    ("kws_ds", "cortex-m33"),  # depthwise-separable, average pool, the CPU target
    pytest.param("transformer", "imxrt700cm", marks=pytest.mark.slow),  # layer norm, softmax, matmuls
    pytest.param("squeezenet", "cortex-m33", marks=pytest.mark.slow),  # max pool, concat
    pytest.param("resnet_projection", "imxrt700", marks=pytest.mark.slow),  # residual adds, strided 1x1
    pytest.param("dilated", "imxrt700cm", marks=pytest.mark.slow),  # dilated convolutions
]


@pytest.mark.parametrize(("name", "target"), CASES)
def test_exact_leaves_equal_torchs_float64_evaluation(
    name: str, target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from etforge.runtime.verification import exact_sums, reference
    from etforge.runtime.verification.constant_nodes import ConstantNodes
    from etforge.runtime.verification.exact_batched import exact_leaves_all
    from etforge.runtime.verification.inputs import seeded_inputs

    result, report = _compiled(name, target)
    q_fn = result.quantized_program.module(check_guards=False)
    inputs = seeded_inputs(report, 0, 10)
    taken: list[str] = []
    real = exact_sums.integer_sum

    def counted(n: torch.fx.Node, *args: Any) -> Any:
        out = real(n, *args)
        if out is not None:
            taken.append(n.name)
        return out

    monkeypatch.setattr(reference, "integer_sum", counted)
    new = exact_leaves_all(result.host_program, q_fn, inputs, ConstantNodes(q_fn.graph))
    convs = [n for n in q_fn.graph.nodes if n.target is torch.ops.aten.conv2d.default]
    assert taken and set(taken) >= {n.name for n in convs[:1]}  # the integer sums ran
    monkeypatch.setattr(reference, "integer_sum", lambda *a: None)  # torch's float64 ops, as before
    old = exact_leaves_all(result.host_program, q_fn, inputs, ConstantNodes(q_fn.graph))
    assert len(new) == len(old) == len(inputs)
    for a, b in zip(new, old, strict=True):
        assert all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b, strict=True))
    # the float32 reference: quantize / dequantize round trips fused, the same outputs bit for bit
    from etforge.runtime.verification.constant_fold import folded, round_trip

    q_ref = folded(q_fn)
    assert any(n.target is round_trip for n in q_ref.graph.nodes)
    with torch.no_grad():
        for batch in inputs[:4]:
            a = torch.utils._pytree.tree_leaves(q_ref(*batch))
            b = torch.utils._pytree.tree_leaves(q_fn(*batch))
            assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _quantized(model: torch.nn.Module, x: torch.Tensor) -> torch.fx.GraphModule:
    from etforge.core.build.session import compile_model

    calib = [(x,), (x * 0.5,)]
    return compile_model(model.eval(), calib[0], "imxrt700", calibration=calib).quantized_program.module()


def _env_value(interp: Any, node: torch.fx.Node) -> Any:
    """A node's float64 value in a ``Float64`` run: a dequantize read only by sums is not
    computed there (``exact_sums.DEFERRED``), so it is computed here from its held codes."""
    from etforge.runtime.verification.exact_sums import DEFERRED

    value = interp.env[node]
    if value is not DEFERRED:
        return value
    return interp.call_function(node.target, (interp.env[node.args[0]], *node.args[1:]), {})


def test_a_depthwise_conv_and_a_long_linear_are_their_integer_sums() -> None:
    """The conv's value: the integer sum of its codes (computed here in int64) times the two
    scales plus the bias, and torch's float64 value to rounding; a 4096-wide linear's partial
    sums can pass 2**24, so it sums its codes in float64 (exact below 2**53): again the int64
    sum scaled."""
    from etforge.runtime.verification.exact_sums import F32_EXACT, Sums, integer_sum
    from etforge.runtime.verification.reference import Float64

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1, groups=16), torch.nn.Flatten(1))
    x = torch.randn(1, 16, 8, 8)
    q = _quantized(model, x)
    conv = next(n for n in q.graph.nodes if n.target is torch.ops.aten.conv2d.default)
    found: dict[str, Any] = {}

    class Spy(Float64):
        def run_node(self, n: torch.fx.Node) -> Any:
            if n is conv:
                found["int"] = integer_sum(n, self)
                found["x"], found["w"], found["b"] = (_env_value(self, a) for a in n.args[:3])
            return super().run_node(n)

    with torch.no_grad():
        Spy(q).run(x)
    assert found["int"] is not None
    dq_x, dq_w = conv.args[0], conv.args[1]
    sx = dq_x.args[1]
    sw = getattr(q, str(dq_w.args[1].target)).double()
    qx = torch.round(found["x"] / sx).long()  # the input's codes minus its zero point
    qw = getattr(q, str(dq_w.args[0].target)).long()  # symmetric weights: the codes
    acc = torch.zeros(1, 16, 8, 8, dtype=torch.int64)
    padded = torch.nn.functional.pad(qx, (1, 1, 1, 1))
    for i in range(3):
        for j in range(3):
            acc += padded[:, :, i : i + 8, j : j + 8] * qw[:, 0, i, j].reshape(1, 16, 1, 1)
    assert int(acc.abs().max()) < F32_EXACT
    expected = acc.double() * (sx * sw).reshape(1, 16, 1, 1) + found["b"].reshape(1, 16, 1, 1)
    by_torch = torch.nn.functional.conv2d(found["x"], found["w"], found["b"], 1, 1, 1, 16)
    scale = float(expected.abs().max())
    assert float((found["int"] - expected).abs().max()) <= 1e-15 * scale * 4
    assert float((found["int"] - by_torch).abs().max()) <= 1e-15 * scale * 16

    wide = _quantized(torch.nn.Linear(4096, 8), torch.randn(4, 4096) * 3)
    linear = next(n for n in wide.graph.nodes if n.target is torch.ops.aten.linear.default)
    seen: dict[str, Any] = {}

    class Wide(Float64):
        def run_node(self, n: torch.fx.Node) -> Any:
            if n is linear:
                seen["int"] = integer_sum(n, self, None, sums)
                seen["x"], seen["w"], seen["b"] = (_env_value(self, a) for a in n.args[:3])
            return super().run_node(n)

    sums = Sums()
    with torch.no_grad():
        Wide(wide).run(torch.randn(4, 4096) * 3)
    assert sums.taken == {linear.name} and not sums.left
    dq_x, dq_w = linear.args[0], linear.args[1]
    sx = dq_x.args[1]
    sw = getattr(wide, str(dq_w.args[1].target)).double()
    qx = torch.round(seen["x"] / sx).long()
    qw = getattr(wide, str(dq_w.args[0].target)).long()
    acc = qx @ qw.T  # exact int64 sums
    zx, qmin, qmax = dq_x.args[2:5]
    assert max(qmax - zx, zx - qmin) * int(qw.abs().sum(1).max()) >= F32_EXACT  # float32 not provably exact
    expected = acc.double() * (sx * sw) + seen["b"]
    assert float((seen["int"] - expected).abs().max()) <= 1e-15 * float(expected.abs().max()) * 4


def test_the_float_check_partition_inputs_have_static_shapes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retyping a stripped partition's inputs creates no symbol in the ShapeEnv a program read
    from ``quantized.pt2`` carries (verify's rebuild; a symbol per dimension cost ~10 ms each,
    most of the float check's stripping time): its inputs keep plain int sizes."""
    import io

    from torch.fx.experimental import symbolic_shapes

    from etforge.core.build.session import compile_model
    from etforge.core.lower.driver import lower
    from etforge.core.registry.manager import registry
    from etforge.runtime.verification.float_partitions import stripped

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 1)
    )
    x = torch.randn(1, 3, 8, 8)
    reg = registry()
    result = compile_model(model.eval(), (x,), "imxrt700", calibration=[(x,), (x * 0.5,)], reg=reg)
    saved = io.BytesIO()
    torch.export.save(result.quantized_program, saved)
    saved.seek(0)
    edge, _, _, _ = lower(torch.export.load(saved), reg.target("imxrt700"), None, reg, early=True)
    lowered = next(
        m for _, m in edge.exported_program().graph_module.named_children() if hasattr(m, "original_module")
    )
    created: list[Any] = []
    real = symbolic_shapes.ShapeEnv.create_symbol

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        created.append(args)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(symbolic_shapes.ShapeEnv, "create_symbol", counted)
    program, _ = stripped(lowered.original_module)
    shapes = [n.meta["val"].shape for n in program.graph.nodes if n.op == "placeholder"]
    assert shapes and all(type(d) is int for s in shapes for d in s)
    assert created == []


def test_the_exported_graph_called_as_is_computes_what_the_unlifted_module_does() -> None:
    """``lifted_call``: a model with a dict of outputs and a BatchNorm (parameters and
    buffers) gives module()'s structure and values bit for bit; a model that mutates a buffer
    in place carries it from call to call as the unlifted module does."""
    from etforge.runtime.verification.lifted import lifted_call

    class Two(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.bn = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)

        def forward(self, x: torch.Tensor) -> dict[str, Any]:
            y = self.bn(self.conv(x))
            return {"y": y, "pair": (y.mean(), torch.relu(y))}

    class Counter(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("n", torch.zeros(1))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.n.add_(1)
            return x + self.n

    torch.manual_seed(0)
    x = torch.randn(1, 3, 8, 8)
    ep = torch.export.export(Two().eval(), (x,))
    run = lifted_call(ep)
    assert run is not None
    with torch.no_grad():
        ours, theirs = run(x * 2), ep.module()(x * 2)
    a, spec_a = torch.utils._pytree.tree_flatten(ours)
    b, spec_b = torch.utils._pytree.tree_flatten(theirs)
    assert spec_a == spec_b and all(torch.equal(p, q) for p, q in zip(a, b, strict=True))
    counted = lifted_call(torch.export.export(Counter(), (x,)))
    unlifted = torch.export.export(Counter(), (x,)).module()
    assert counted is not None
    assert [float(counted(x)[0, 0, 0, 0]) for _ in range(3)] == [
        float(unlifted(x)[0, 0, 0, 0]) for _ in range(3)
    ]


def test_a_weight_computed_from_the_input_is_summed_from_each_runs_own_codes() -> None:
    """A linear whose weight is a dequantized input (not a constant): its codes are never kept
    across runs sharing a ``ConstantNodes``; each run's value is torch's float64 one for its
    own weight (to rounding), the second run's included."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401 - registers quantized_decomposed

    from etforge.runtime.verification.constant_nodes import ConstantNodes
    from etforge.runtime.verification.exact_sums import Sums
    from etforge.runtime.verification.reference import Float64

    q, dq = (
        torch.ops.quantized_decomposed.quantize_per_tensor.default,
        torch.ops.quantized_decomposed.dequantize_per_tensor.default,
    )

    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            dx = dq(q(x, 0.05, 3, -128, 127, torch.int8), 0.05, 3, -128, 127, torch.int8)
            dw = dq(q(w, 0.02, 0, -127, 127, torch.int8), 0.02, 0, -127, 127, torch.int8)
            return torch.ops.aten.linear.default(dx, dw)

    gm = torch.fx.symbolic_trace(M())
    constants, sums = ConstantNodes(gm.graph), Sums()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 16, generator=g)
    for k in range(2):
        w = torch.randn(4, 16, generator=g) * (k + 1)
        with torch.no_grad():
            ours = Float64(gm, constants, sums).run(x, w)
            dx = (torch.round(x.double() / 0.05) + 3).clamp(-128, 127).sub(3).mul(0.05)
            dw = torch.round(w.double() / 0.02).clamp(-127, 127).mul(0.02)
            expected = torch.nn.functional.linear(dx, dw)
        assert float((ours - expected).abs().max()) <= 1e-12 * float(expected.abs().max()), k
    assert len(sums.taken) == 1 and not sums.left  # the integer sum ran, on both runs
