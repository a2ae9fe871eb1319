"""torch's references computed on a thread beside verify's sample loop (``runtime.verification.beside``)
are the ones computed on the main thread, bit for bit, while the main thread runs the program;
a failure on the thread is computed again on the main thread and told."""

from __future__ import annotations

from functools import partial

import pytest

from support import compiled_architecture, same_leaves


@pytest.mark.parametrize(("name", "target"), [("shufflenet", "imxrt700cm"), ("kws_ds", "cortex-m33")])
def test_the_references_on_a_thread_are_the_main_threads(name: str, target: str) -> None:
    from etforge.core.common.threads import one_thread
    from etforge.runtime.execution.host import run_program
    from etforge.runtime.verification.beside import Beside
    from etforge.runtime.verification.inputs import seeded_inputs
    from etforge.runtime.verification.lifted import unlifted
    from etforge.runtime.verification.stepwise import DEVICE_KERNELS
    from etforge.runtime.verification.verify import _references

    result, report = compiled_architecture(name, target)
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
    assert same_leaves(exact_h, exact_t) and same_leaves(float_h, float_t) and same_leaves(q_h, q_t)
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
