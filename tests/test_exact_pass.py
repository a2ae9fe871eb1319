"""The per-op gates judged from the device simulation's one pass (``runtime.verification.exact_pass``) give
what the teacher-forced checks give, op for op, and a sample with any value off runs the
teacher-forced checks (which name it)."""

from __future__ import annotations

from typing import Any

import pytest
import torch


def _compiled(model: torch.nn.Module, calib: list[tuple[torch.Tensor, ...]], target: str) -> tuple[Any, Any]:
    from etforge.core.build.report import build_report
    from etforge.core.build.session import compile_model
    from etforge.core.registry.manager import registry

    reg = registry()
    result = compile_model(model.eval(), calib[0], target, calibration=calib, reg=reg)
    return result, build_report(result, reg, type(model).__name__)


def _both(result: Any, report: Any, monkeypatch: pytest.MonkeyPatch, host: Any = None) -> tuple[Any, Any]:
    """(verify's figures with the one pass, with every sample teacher-forced)."""
    from etforge.core.build.pipeline import clone_program
    from etforge.runtime.verification import exact_pass
    from etforge.runtime.verification.verify import compare

    program = host if host is not None else result.host_program

    def run() -> Any:  # each run on its own copies: the float check lowers the float program
        float_ep, qep = clone_program(result.float_program), clone_program(result.quantized_program)
        return compare(program, float_ep, qep, report, samples=4)

    fast = run()
    with monkeypatch.context() as m:
        m.setattr(exact_pass, "judged", lambda *a: None)
        full = run()
    return fast, full


def _same(fast: Any, full: Any) -> None:
    assert fast.ops == full.ops and fast.skipped == full.skipped
    assert fast.failures == full.failures and fast.not_exact == full.not_exact
    assert fast.cpu_not_exact == full.cpu_not_exact and fast.sim_max_steps == full.sim_max_steps


@pytest.mark.parametrize("target", ["imxrt700cm", "imxrt700"])
def test_one_pass_equals_teacher_forcing_on_a_mixed_program(
    target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The transformer of the architecture suite: NPU partitions and CPU ops (CMSIS-NN and
    portable), ops without a rule: every figure per op is the teacher-forced one."""
    from models.architectures import build

    model, _, calibration = build("transformer")
    result, report = _compiled(model, calibration, target)
    fast, full = _both(result, report, monkeypatch)
    assert fast.samples_from_simulation == 3 and full.samples_from_simulation == 0  # all but the first
    assert fast.ok and fast.cpu_values > 0 and fast.op_values > 0
    _same(fast, full)


def test_a_value_off_runs_the_teacher_forced_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CMSIS-NN conv's output offset moved by one (every value one step off): no sample is
    judged from the simulation, and the failures are the teacher-forced ones."""
    from etforge.core.build.pipeline import clone_program

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3), torch.nn.Flatten(),
        torch.nn.Linear(4 * 6 * 6, 10),
    )  # fmt: skip
    g = torch.Generator().manual_seed(0)
    result, report = _compiled(
        model, [(torch.randn(1, 3, 8, 8, generator=g),) for _ in range(4)], "cortex-m33"
    )
    broken = clone_program(result.host_program)
    node = next(n for n in broken.graph.nodes if "quantized_conv2d" in str(n.target))
    args = list(node.args)
    args[7] = int(args[7]) + 1  # output_offset
    node.args = tuple(args)
    fast, full = _both(result, report, monkeypatch, broken)
    assert fast.samples_from_simulation == 0 and not fast.ok
    assert any(f.startswith(f"CPU op {node.name} has ") for f in fast.failures), fast.failures
    _same(fast, full)
