"""torch's references computed on a thread beside verify's sample loop (``runtime.verification.beside``)
are the ones computed on the main thread, bit for bit, while the main thread runs the program;
a failure on the thread is computed again on the main thread and told."""

from __future__ import annotations

from functools import partial
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


def _same(a: Any, b: Any) -> bool:
    la, sa = torch.utils._pytree.tree_flatten(a)
    lb, sb = torch.utils._pytree.tree_flatten(b)
    return sa == sb and all(
        x.dtype == y.dtype and torch.equal(x, y) and torch.equal(torch.signbit(x), torch.signbit(y))
        if isinstance(x, torch.Tensor)
        else x == y
        for x, y in zip(la, lb, strict=True)
    )


@pytest.mark.parametrize(("name", "target"), [("shufflenet", "imxrt700cm"), ("kws_ds", "cortex-m33")])
def test_the_references_on_a_thread_are_the_main_threads(name: str, target: str) -> None:
    from etforge.core.common.threads import one_thread
    from etforge.runtime.execution.host import run_program
    from etforge.runtime.verification.beside import Beside
    from etforge.runtime.verification.inputs import seeded_inputs
    from etforge.runtime.verification.lifted import unlifted
    from etforge.runtime.verification.stepwise import DEVICE_KERNELS
    from etforge.runtime.verification.verify import _references

    result, report = _compiled(name, target)
    inputs = seeded_inputs(report, 0, 9)
    q_fn = unlifted(result.quantized_program)
    compute = partial(_references, result.host_program, result.float_program, q_fn, inputs)
    with one_thread():
        here = compute()
        beside = Beside(compute)
        for batch in inputs:  # the main thread busy meanwhile, as verify's sample loop is
            run_program(result.host_program, batch, DEVICE_KERNELS)
        there = beside.result()
    assert beside.where == "a thread beside the sample loop"
    exact_h, float_h, q_h, sums_h = here
    exact_t, float_t, q_t, sums_t = there
    assert _same(exact_h, exact_t) and _same(float_h, float_t) and _same(q_h, q_t)
    assert (sums_h.taken, sums_h.left) == (sums_t.taken, sums_t.left)


def test_a_failure_on_the_thread_is_computed_again_and_told() -> None:
    import threading

    from etforge.runtime.verification.beside import Beside

    calls: list[str] = []

    def compute() -> int:
        calls.append(threading.current_thread().name)
        if len(calls) == 1:
            raise RuntimeError("out of memory on the thread")
        return 42

    beside = Beside(compute)
    assert beside.result() == 42
    assert calls == ["etforge-references", threading.main_thread().name]
    assert (
        beside.where == "the main thread (the other thread failed: RuntimeError: out of memory on the thread)"
    )
