"""The compiled program's runs on a thread ahead of verify's sample loop (``runtime.verification.ahead``)
are the ones the main thread computes, bit for bit and in sample order; a failure on the thread
is undone, computed again on the main thread and told; each thread keeps its own LiteRT
interpreters and kernel_memo blocks."""

from __future__ import annotations

import dataclasses
import gc
import threading
import weakref
from typing import Any

import pytest

from support import compiled_architecture, same_leaves


def test_results_come_in_order_at_most_depth_ahead() -> None:
    from etforge.runtime.verification.ahead import AHEAD, Ahead

    ahead_of_taken: list[int] = []
    taken = [0]

    def compute(i: int) -> tuple[int, str]:
        ahead_of_taken.append(i - taken[0])
        return i * i, threading.current_thread().name

    ahead = Ahead(compute, 10, depth=3)
    try:
        for i in range(10):
            assert ahead.take(i) == (i * i, "etforge-program-runs")
            taken[0] = i + 1
    finally:
        ahead.close()
    assert max(ahead_of_taken) <= 3 and ahead.where == AHEAD and ahead.failed is None
    with pytest.raises(ValueError, match="in order"):
        Ahead(compute, 2, depth=1).take(1)


def test_a_failure_on_the_thread_is_undone_computed_again_and_told() -> None:
    from etforge.runtime.verification.ahead import Ahead

    where: dict[int, list[str]] = {}
    undone: list[int] = []

    def compute(i: int) -> int:
        where.setdefault(i, []).append(threading.current_thread().name)
        if i == 2 and threading.current_thread().name == "etforge-program-runs":
            raise MemoryError("no room on the thread")
        return -i

    ahead = Ahead(compute, 5, depth=5, undo=undone.append)
    try:
        assert [ahead.take(i) for i in range(5)] == [0, -1, -2, -3, -4]
    finally:
        ahead.close()
    main = threading.main_thread().name
    assert where == {
        0: ["etforge-program-runs"],
        1: ["etforge-program-runs"],
        2: ["etforge-program-runs", main],
        3: [main],
        4: [main],
    }
    assert undone == [2] and ahead.failed_at == 2
    assert ahead.where == "the main thread (the other thread failed: MemoryError: no room on the thread)"


def test_closing_early_stops_the_thread() -> None:
    from etforge.runtime.verification.ahead import Ahead

    computed: list[int] = []
    ahead = Ahead(computed.append, 100, depth=2)
    ahead.take(0)
    ahead.close()
    assert not ahead._thread.is_alive() and len(computed) <= 4


def test_each_thread_keeps_its_own_interpreters_and_memo_blocks() -> None:
    """A ``keeping()`` or ``recording()`` block holds for its own thread: a run on another
    thread meanwhile neither lands in the store nor reads its interpreters."""
    import numpy as np
    import torch

    from etforge.runtime.execution import kernel_memo, litert_run

    result, _ = compiled_architecture("shufflenet", "imxrt700cm")
    program = result.host_program
    lowered = next(
        getattr(program.graph_module, n.target)
        for n in program.graph.nodes
        if n.op == "get_attr" and n.target.startswith("lowered_module")
    )
    from etforge.core.litert import payload

    model = payload.unpack_for_host(bytes(lowered.processed_bytes)).data
    it = litert_run._interpreter(model, "default")
    inputs = [np.zeros(d["shape"], d["dtype"]) for d in it.get_input_details()]
    store: dict[Any, Any] = {}
    memo = kernel_memo.Store()
    other: dict[str, Any] = {}

    def elsewhere() -> None:
        other["active"] = kernel_memo.active()
        mine = litert_run._interpreter(model, "default")
        other["same"] = mine is it
        other["interpreter"] = weakref.ref(mine)
        litert_run.run(model, inputs, "reference")  # not kept: this thread has no keeping() block
        other["kept"] = litert_run.kept(model, "reference", inputs)
        out = torch.empty(3)
        kernel_memo.call(lambda x, o: o.copy_(x), [torch.ones(3)], out)  # not recorded: no block here

    with litert_run.keeping("reference", store), kernel_memo.recording(memo, 0):
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
        assert store == {} and memo.runs == {}
        litert_run.run(model, inputs, "reference")
        assert litert_run.kept(model, "reference", inputs) is not None
    assert other["active"] is False and other["kept"] is None
    assert other["same"] is False  # an interpreter is not thread-safe: one per thread
    gc.collect()
    assert other["interpreter"]() is None  # a thread's interpreters go with it


def _compare(result: Any, report: dict[str, Any], fail_at: int | None, monkeypatch: Any) -> Any:
    """compare() on 6 samples with the kernel memo and the Edge outputs; ``fail_at``: the
    thread's LiteRT call that raises (its later samples then run on the main thread)."""
    from etforge.runtime.execution import kernel_memo, litert_run
    from etforge.runtime.verification.verify import compare

    real = litert_run.run
    on_thread = [0]

    def run(model: bytes, inputs: Any, kernels: str = "default") -> Any:
        if threading.current_thread().name == "etforge-program-runs":
            on_thread[0] += 1
            if on_thread[0] == fail_at:
                raise RuntimeError("injected on the thread")
        return real(model, inputs, kernels)

    monkeypatch.setattr(litert_run, "run", run)
    memo, edge = kernel_memo.Store(), []
    v = compare(
        result.host_program, result.float_program, result.quantized_program, report, samples=6,
        edge_outputs=edge, memo=memo,
    )  # fmt: skip
    monkeypatch.setattr(litert_run, "run", real)
    return v, memo, edge, on_thread[0]


def test_runs_on_the_thread_are_the_main_threads(monkeypatch: Any) -> None:
    """A thread that fails at sample 3's run with the user's kernels (after its device run
    recorded its CPU kernels' calls): samples 3-6 run on the main thread, their half record
    undone; every figure, gate and recorded call the same as with all runs on the thread."""
    result, report = compiled_architecture("shufflenet", "imxrt700cm")
    ahead, memo_a, edge_a, calls = _compare(result, report, None, monkeypatch)
    assert ahead.program_runs_in == "a thread ahead of the sample loop"
    assert calls == 12  # 6 samples x (reference kernels, default kernels)
    main, memo_m, edge_m, _ = _compare(result, report, 6, monkeypatch)  # sample 3's default-kernel run
    assert main.program_runs_in == (
        "the main thread (the other thread failed: RuntimeError: injected on the thread)"
    )
    assert main.notes[-1].startswith("the program's runs from sample 3 on were computed in the main thread")
    a, m = dataclasses.asdict(ahead), dataclasses.asdict(main)
    for field in ("program_runs_in", "notes", "seconds"):
        a.pop(field), m.pop(field)
    assert a == m and ahead.notes == main.notes[:-1]
    assert same_leaves(edge_a, edge_m)
    assert memo_a.nbytes == memo_m.nbytes and memo_a.runs.keys() == memo_m.runs.keys()
    for run, calls_a in memo_a.runs.items():
        calls_m = memo_m.runs[run]
        assert len(calls_a) == len(calls_m) > 0  # the cut-short run's calls recorded once, not twice
        assert all(same_leaves(x.out, y.out) for x, y in zip(calls_a, calls_m, strict=True))
