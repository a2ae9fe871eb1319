"""verify judges with the device's arithmetic: MEAN / AVERAGE_POOL cases exact at 0 steps,
the whole program equal to its device-arithmetic simulation, a CPU op far off named."""

from __future__ import annotations

from typing import Any

import torch

F = torch.nn.functional


def _compile_compare(model: torch.nn.Module, shape: tuple[int, ...], target: str, samples: int = 4) -> Any:
    from etforge.core.build.report import build_report
    from etforge.core.build.session import compile_model
    from etforge.core.registry.manager import registry
    from etforge.runtime.verification.verify import compare

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    calib = [(torch.randn(*shape, generator=g),) for _ in range(4)]
    reg = registry()
    result = compile_model(model.eval(), calib[0], target, calibration=calib, reg=reg)
    report = build_report(result, reg, type(model).__name__)
    v = compare(result.host_program, result.float_program, result.quantized_program, report, samples=samples)
    return result, report, v


class _MobileNetV3Block(torch.nn.Module):
    """conv + hardswish, depthwise, squeeze-excite (global average, hardsigmoid), avg pool."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.c = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.d = torch.nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.se1, self.se2 = torch.nn.Conv2d(16, 4, 1), torch.nn.Conv2d(4, 16, 1)
        self.fc = torch.nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.c(x))
        y = F.relu(self.d(y))
        s = F.hardsigmoid(self.se2(F.relu(self.se1(F.adaptive_avg_pool2d(y, 1)))))
        y = F.avg_pool2d(y * s, 2)
        return self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1))


class _AttentionStats(torch.nn.Module):
    """An attention-ish block with two ``mean`` ops (layer-norm statistics)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.q, self.o = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = x - x.mean(-1, keepdim=True)
        var = (v * v).mean(-1, keepdim=True)
        return self.o(self.q(v) * var + x)


def _exact_ops(v: Any, name: str) -> list[dict[str, Any]]:
    return [o for o in v.ops if o["partition"] != "cpu" and name in o["node"]]


def test_mobilenet_v3_style_average_pools_are_exact_on_imxrt700cm() -> None:
    _, _, v = _compile_compare(_MobileNetV3Block(), (1, 3, 16, 16), "imxrt700cm")
    assert v.ok, v.failures
    pools = _exact_ops(v, "avg_pool")
    assert pools and all(o["device_exact"] and o["values_off"] == 0 for o in pools), pools
    assert v.exact_values > 0 and v.exact_values_off == 0


def test_two_means_are_exact_and_the_whole_program_equals_its_simulation() -> None:
    _, _, v = _compile_compare(_AttentionStats(), (1, 16, 32), "imxrt700")
    assert v.ok, v.failures
    means = _exact_ops(v, "mean")
    assert len(means) == 2 and all(o["device_exact"] and o["values_off"] == 0 for o in means), means
    assert v.not_exact == [] and v.whole_model_on_npu
    assert v.sim_max_steps == 0.0 and v.sim_not_exact == []


def test_a_cpu_op_far_off_fails_verify_naming_it() -> None:
    """cortex-m33: a conv's output offset moved by 100 steps in the compiled program."""
    from etforge.core.build.pipeline import clone_program
    from etforge.runtime.verification.verify import compare

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3), torch.nn.Flatten(),
        torch.nn.Linear(4 * 6 * 6, 10),
    )  # fmt: skip
    result, report, good = _compile_compare(model, (1, 3, 8, 8), "cortex-m33", samples=2)
    assert good.ok, good.failures
    assert good.sim_exact and good.sim_max_steps == 0.0 and good.cpu_not_exact == []
    assert good.cpu_op_max_steps == 0 and good.cpu_values_off == 0
    broken = clone_program(result.host_program)
    conv = next(n for n in broken.graph.nodes if "quantized_conv2d" in str(n.target))
    args = list(conv.args)
    args[7] = int(args[7]) + 100  # output_offset
    conv.args = tuple(args)
    v = compare(broken, result.float_program, result.quantized_program, report, samples=2)
    assert not v.ok
    assert [f for f in v.failures if f.startswith(f"CPU op {conv.name} has ") and "max 100 steps" in f], (
        v.failures
    )
    assert [f for f in v.failures if "simulated in the device's arithmetic" in f], v.failures


def test_a_cortex_m_linear_is_exact_in_cmsis_nn_rounding() -> None:
    """cortex-m33 Linear (``arm_fully_connected_s8``): the CPU reference requantizes with two
    roundings as CMSIS-NN does and equals the host's kernel on every value, while LiteRT's
    FULLY_CONNECTED rule (one rounding, ``device_ref``) is off on a few: CPU ops need the CPU
    kernel's rule."""
    from etforge.core.build.session import compile_model
    from etforge.plugins.targets.cortex_m_host import cmsis_reference
    from etforge.runtime.arithmetic.device_ref import Reference
    from etforge.runtime.execution.host import run_program
    from etforge.runtime.verification.stepwise import HostInt8Values, observer_names

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    calib = [(torch.randn(4, 64, generator=g),) for _ in range(4)]
    result = compile_model(torch.nn.Linear(64, 256).eval(), calib[0], "cortex-m33", calibration=calib)
    module = result.quantized_program.module(check_guards=False)
    off = {"cmsis": 0, "litert": 0, "values": 0}

    class Forced(torch.fx.Interpreter):  # the quantized program on the host's int8 values
        forced: dict[str, Any] = {}

        def run_node(self, n: torch.fx.Node) -> Any:
            out = super().run_node(n)
            if n.name not in self.forced:
                return out
            _, _, op, ours = self.forced[n.name]
            if "quantized_linear" in op:
                value = lambda a: self.env[a]  # noqa: E731
                off["cmsis"] += int((cmsis_reference(value, op)(n).reshape(ours.shape) != ours).sum())
                off["litert"] += int((Reference(value)(n).reshape(ours.shape) != ours).sum())
                off["values"] += ours.numel()
            return ours

    for _ in range(8):
        x = (torch.randn(4, 64, generator=g),)
        values = HostInt8Values(observer_names(result.quantized_program))
        run_program(result.host_program, x, observe=values)
        interpreter = Forced(module, garbage_collect_values=False)
        interpreter.forced = values.forced(module)
        interpreter.run(*x)
    assert off["values"] == 8 * 4 * 256
    assert off["cmsis"] == 0
    assert off["litert"] > 0  # 8 of 8,192 when measured
