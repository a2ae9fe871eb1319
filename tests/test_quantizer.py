"""The composed quantizer: fixed/shared qparams where LiteRT requires them, fusion, and QAT."""

from __future__ import annotations

import torch

from etforge.core.build import pipeline
from etforge.core.graph.utils import is_dequantize, node_op
from etforge.core.quantize.quantizer import ComposedQuantizer, convert, prepare
from etforge.core.registry.manager import registry
from etforge.runtime.execution.host import run_program


def _quantized(module: torch.nn.Module, x: tuple[torch.Tensor, ...]) -> torch.fx.GraphModule:
    reg = registry()
    gm = prepare(
        pipeline.export(module, x).module(check_guards=False),
        ComposedQuantizer(reg.rules_for(reg.target("litert"))),
    )
    gm(*x)
    return convert(gm)


def _qparams_after(gm: torch.fx.GraphModule, op: str) -> tuple[float, int]:
    node = next(n for n in gm.graph.nodes if node_op(n) == op)
    q = next(iter(node.users))
    return float(q.args[1]), int(q.args[2])


def test_fixed_qparams_for_sigmoid_softmax_tanh() -> None:
    x = (torch.randn(2, 8) * 5,)
    assert _qparams_after(_quantized(torch.nn.Sigmoid(), x), "aten.sigmoid.default") == (1 / 256, -128)
    assert _qparams_after(_quantized(torch.nn.Softmax(-1), x), "aten.softmax.int") == (1 / 256, -128)
    assert _qparams_after(_quantized(torch.nn.Tanh(), x), "aten.tanh.default") == (1 / 128, 0)


def test_shared_qparams_for_max_pool_and_reshape() -> None:
    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.max_pool2d(x * 3.0, 2).flatten(1)

    gm = _quantized(M(), (torch.randn(1, 2, 4, 4),))
    mul = _qparams_after(gm, "aten.mul.Tensor")
    assert _qparams_after(gm, "aten.max_pool2d.default") == mul
    assert _qparams_after(gm, "aten.flatten.using_ints") == mul


def test_conv_relu_share_one_output_observer() -> None:
    gm = _quantized(
        torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()), (torch.randn(1, 3, 6, 6),)
    )
    conv = next(n for n in gm.graph.nodes if node_op(n) == "aten.conv2d.default")
    assert [node_op(u) for u in conv.users] == ["aten.relu.default"]  # no Q/DQ between conv and relu
    weight_dq = conv.args[1]
    assert is_dequantize(weight_dq) and "per_channel" in node_op(weight_dq)
    bias_dq = conv.args[2]
    assert is_dequantize(bias_dq) and bias_dq.args[-1] == torch.int32


def test_qat_uses_the_same_rules_and_lowers_exactly() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(64, 3)
    )
    x = (torch.randn(4, 3, 4, 4),)
    reg = registry()
    target = reg.target("litert")
    exported = torch.export.export(model.train(), x)
    gm = prepare(
        exported.module(check_guards=False), ComposedQuantizer(reg.rules_for(target), is_qat=True), qat=True
    )
    opt = torch.optim.SGD(gm.parameters(), lr=0.01)
    for _ in range(3):
        opt.zero_grad()
        gm(*x).square().mean().backward()
        opt.step()
    gm = convert(gm)
    qep = torch.export.export(gm, x)
    edge, partitioner, parts, _ = pipeline.lower(qep, target, None, reg)
    assert all(d.npu for d in partitioner.decisions) and len(parts) == 1
    out = run_program(edge.exported_program(), x)[0]
    ref = gm(*x)
    out_dq = next(n for n in edge.exported_program().graph.nodes if n.op == "output").args[0][0]
    scale = float(out_dq.args[1])
    assert float((out - ref).abs().max()) <= scale * 1.001


def test_eval_dropout_shares_its_input_qparams_so_the_npu_never_requantizes() -> None:
    """Eval dropout is an identity (a clone in Edge); the op after it must not observe the
    same values again, which left a requantizing QUANTIZE on the NPU (MobileNetV2 on imxrt700)."""
    from etforge.core.build.session import compile_model

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Dropout(0.2),
        torch.nn.Linear(8, 4),
    ).eval()
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(1, 3, 8, 8, generator=g),) for _ in range(4)]
    for target in ("imxrt700", "imxrt700cm"):
        result = compile_model(model, calib[0], target, calibration=calib)
        (part,) = result.partitions
        assert "QUANTIZE" not in part.converted.operators, (target, part.converted.operators)
        q = result.quantized_program.graph_module.graph
        drop = next(n for n in q.nodes if node_op(n) == "aten.dropout.default")
        src, (dst,) = drop.args[0], list(drop.users)
        assert (src.args[1], src.args[2]) == (dst.args[1], dst.args[2])  # one scale, one zero point


class _Constants(torch.nn.Module):
    """Weights (conv, linear), a buffer added to an activation and a value computed from it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.fc = torch.nn.Linear(6, 5)
        self.register_buffer("offset", torch.linspace(-2, 3, 6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x)).mean((1, 2)) + self.offset * 0.5
        return self.fc(y) + self.offset[:5]


def test_calibrate_observes_each_constant_once_to_the_same_qparams() -> None:
    """calibrate() stops observing weights after one batch and convert() asks each observer
    once: the observers end where a plain loop leaves them, and the converted graph and its
    constants are the plain flow's, on the NPU rules and on the Cortex-M quantizer alike."""
    from etforge.core.quantize.ptq import quantizer_for
    from etforge.core.quantize.quantizer import _constant_min_max_observers, calibrate

    torch.manual_seed(0)
    model = _Constants().eval()
    gen = torch.Generator().manual_seed(2)
    batches = [(torch.randn(1, 3, 6, 6, generator=gen) * (i + 1),) for i in range(4)]
    reg = registry()
    for target in ("imxrt700", "cortex-m33"):
        ep = pipeline.export(model, batches[0])
        plain = prepare(ep.module(check_guards=False), quantizer_for(reg.target(target), reg=reg))
        ours = prepare(ep.module(check_guards=False), quantizer_for(reg.target(target), reg=reg))
        assert _constant_min_max_observers(ours), target  # the weights' observers, at least
        with torch.no_grad():
            for batch in batches:
                plain(*batch)
        calibrate(ours, batches)
        plain_state, ours_state = plain.state_dict(), ours.state_dict()
        assert plain_state.keys() == ours_state.keys()
        for name, value in plain_state.items():
            assert torch.equal(ours_state[name], value), (target, name)
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

        theirs, mine = convert_pt2e(plain), convert(ours)
        assert str(mine.graph) == str(theirs.graph), target
        for (name, value), (_, other) in zip(
            theirs.state_dict().items(), mine.state_dict().items(), strict=True
        ):
            assert torch.equal(value, other), (target, name)
