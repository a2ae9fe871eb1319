"""Does ``model.pte`` compute what the Edge program computes? And if not, where does it start?

``verify`` runs both on the same inputs. Their outputs must be equal (the same kernels, the
same LiteRT partitions: any difference is the serialized program's — its memory plan, its
constants, its instructions). On a difference the first instruction that goes wrong is
named: first against a run of the same file with a separate buffer per tensor (a value that
changes only when tensors share the planned buffers is a memory-plan overlap, and the
instruction that overwrote it is named), then against the Edge program's node values,
matched to instructions in program order by operator name.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch.export import ExportedProgram

from etforge.core.front.load import non_finite_count
from etforge.core.graph.utils import node_op
from etforge.runtime.execution import kernel_memo
from etforge.runtime.execution.host import run_program
from etforge.runtime.execution.pte_interpreter import PteInterpreter, Step


@dataclass
class Agreement:
    """The interpreter of ``model.pte`` against the Edge-level host run, over ``samples``."""

    samples: int = 0
    #: Samples on which every output of the two runs is equal.
    agreed: int = 0
    max_abs_diff: float = 0.0
    #: Where the first differing sample first differs (None: they agree).
    first_difference: str | None = None
    #: Interpreter time per sample.
    seconds_per_sample: float = 0.0
    #: The interpreter's host kernel calls (``kernel_memo``), and those byte-identical to an
    #: Edge run's call (kernel, arguments, input bytes, output layout): its result written.
    kernel_calls: int = 0
    repeated_calls: int = 0

    @property
    def ok(self) -> bool:
        return self.agreed == self.samples


def _equal(a: Any, b: Any) -> bool:
    """Equal values, a NaN equal to a NaN in the same place (both runs computed it)."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if torch.equal(a, b):
            return True
        return a.is_floating_point() and bool(torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    return float((a.double() - b.double()).abs().max()) if a.numel() else 0.0


def compare_with_edge(
    interp: PteInterpreter,
    program: ExportedProgram,
    batches: Sequence[tuple[torch.Tensor, ...]],
    kernels: str = "default",
    edge_outputs: Sequence[list[Any]] | None = None,
    memo: kernel_memo.Store | None = None,
) -> Agreement:
    """``edge_outputs``: the Edge program's outputs on ``batches`` when already computed;
    ``memo``: the host kernel calls of those runs (a call of the ``.pte`` equal to one of them
    byte for byte takes its result, ``kernel_memo``)."""
    result = Agreement(samples=len(batches))
    spent = 0.0
    serving = partial(kernel_memo.serving, memo) if memo is not None else (lambda run: nullcontext())
    for n, batch in enumerate(batches):
        start = time.perf_counter()
        with serving(n):
            ours = interp.run(batch, kernels)
        spent += time.perf_counter() - start
        edge = edge_outputs[n] if edge_outputs is not None else run_program(program, batch, kernels)
        same = len(ours) == len(edge) and all(_equal(a, b) for a, b in zip(ours, edge, strict=False))
        if same:
            result.agreed += 1
            continue
        diffs = [_diff(a, b) for a, b in zip(ours, edge, strict=False)] or [float("inf")]
        result.max_abs_diff = max(result.max_abs_diff, *diffs)
        if result.first_difference is None:
            where = first_difference(interp, program, batch, kernels)
            result.first_difference = f"sample {n}: max |diff| {max(diffs):.4g}; {where}"
    result.seconds_per_sample = spent / max(1, len(batches))
    if memo is not None:
        result.kernel_calls, result.repeated_calls = memo.calls, memo.hits
    return result


Record = tuple[Step, list[Any], list[tuple[int, Any]]]


def _trace(
    interp: PteInterpreter, batch: Sequence[torch.Tensor], kernels: str, planned: bool
) -> list[Record]:
    records: list[Record] = []
    interp.run(batch, kernels, planned=planned, trace=lambda s, r, w: records.append((s, r, w)))
    return records


def first_difference(
    interp: PteInterpreter, program: ExportedProgram, batch: Sequence[torch.Tensor], kernels: str
) -> str:
    """A one-line account of the first instruction whose values differ."""
    planned = _trace(interp, batch, kernels, planned=True)
    fresh = _trace(interp, batch, kernels, planned=False)
    # A planned tensor no instruction writes is scratch (CMSIS-NN buffers): its bytes are
    # whatever the arena held, by design, and are not compared.
    defined = set(interp.plan.inputs) | {i for _, _, w in planned for i, _ in w}
    defined |= {i for i, spec in interp.specs.items() if spec.mem_id is None} | set(interp.views())
    nan = _non_finite_source(planned)
    for (step, reads, writes), (_, reads2, writes2) in zip(planned, fresh, strict=False):
        keep = [k for k, v in enumerate(interp.io(step)[0]) if v in defined]
        reads_differ = not _equal([reads[k] for k in keep], [reads2[k] for k in keep])
        writes_differ = not _equal([w for _, w in writes], [w for _, w in writes2])
        if (reads_differ or writes_differ) and nan is not None and nan[0] <= step.index:
            return nan[1]
        if reads_differ:
            return _clobbered(interp, planned, step, reads, reads2, defined)
        if writes_differ:
            return (
                f"first at instruction {step.index} ({step.name}): it writes other values into the "
                "planned buffers than into separate ones: its output overlaps one of its inputs in "
                "the memory plan"
            )
    return _against_edge(interp, program, batch, kernels, planned, nan)


def _non_finite_source(records: list[Record]) -> tuple[int, str] | None:
    """(instruction index, account) of the first instruction writing NaN or infinity, the cause
    of any difference from there on: what a kernel makes of a NaN (an int8 quantize: x86 and
    Arm convert it differently) is not defined, so two runs may disagree with no fault in the
    memory plan."""
    for step, _, writes in records:
        for value, w in writes:
            count = non_finite_count(w) if isinstance(w, torch.Tensor) else 0
            if count:
                return step.index, (
                    f"first at instruction {step.index} ({step.name}): it writes {count} NaN/infinite "
                    f"value(s) (value {value}; a division by zero or an overflow), and what the "
                    "kernels after it make of them is undefined: the model computes a non-finite value"
                )
    return None


def _clobbered(
    interp: PteInterpreter,
    records: list[Record],
    step: Step,
    reads: list[Any],
    reads2: list[Any],
    defined: set[int],
) -> str:
    """Name the input that changed between being written and being read, and who wrote over it."""
    inputs = interp.io(step)[0]
    bad = next(v for v, a, b in zip(inputs, reads, reads2, strict=True) if v in defined and not _equal(a, b))
    head = f"first at instruction {step.index} ({step.name}): its input value {bad}"
    spec = interp.specs.get(bad)
    writer = max(
        (s.index for s, _, w in records if s.index < step.index and any(i == bad for i, _ in w)), default=-1
    )
    if spec is None or spec.mem_id is None:
        return f"{head} differs from a run with a separate buffer per tensor"
    lo, hi = spec.offset, spec.offset + spec.nbytes
    culprits = []
    for s, _, written in records:
        if not writer < s.index < step.index:
            continue
        for v, _ in written:
            o = interp.specs.get(v)
            if (
                v != bad
                and o is not None
                and o.mem_id == spec.mem_id
                and o.offset < hi
                and lo < o.offset + o.nbytes
            ):
                culprits.append(
                    f"instruction {s.index} ({s.name}) writing value {v} at [{o.offset}, {o.offset + o.nbytes})"
                )
    by = f"; overwritten by {culprits[0]}" if culprits else ""
    since = f" (written by instruction {writer})" if writer >= 0 else ""
    return (
        f"{head}{since} at memory id {spec.mem_id} [{lo}, {hi}) changed before this read{by}: "
        "the memory plan overlaps tensors that are alive at the same time"
    )


def _base(op: str) -> str:
    """``aten::convolution.out`` / ``aten.convolution.default`` -> ``aten::convolution``."""
    if "::" in op:
        ns, _, rest = op.partition("::")
        return f"{ns}::{rest.split('.')[0]}"
    parts = op.split(".")
    return f"{parts[0]}::{parts[1]}" if len(parts) >= 2 else op


def _flat(value: Any) -> list[Any]:
    if isinstance(value, (tuple, list)):
        return [x for v in value for x in _flat(v)]
    return [value]


def _against_edge(
    interp: PteInterpreter,
    program: ExportedProgram,
    batch: Sequence[torch.Tensor],
    kernels: str,
    records: list[Record],
    nan: tuple[int, str] | None,
) -> str:
    """Match instructions to Edge nodes in program order by operator; the first whose outputs
    differ (or ``nan``, the first non-finite write, when it comes no later)."""
    nodes: list[tuple[str, str, Any]] = []

    def observe(node: torch.fx.Node, value: Any) -> None:
        if node.op != "call_function":
            return
        op = node_op(node)
        if node.target is torch.ops.higher_order.executorch_call_delegate:
            nodes.append(("delegate", node.name, value))
        elif "getitem" not in op:
            nodes.append((_base(op), node.name, value))

    run_program(program, batch, kernels, observe=observe)
    cursor = 0
    for step, _, writes in records:
        if step.kind not in ("kernel", "delegate"):
            continue
        key = "delegate" if step.kind == "delegate" else _base(step.name)
        match = next((j for j in range(cursor, len(nodes)) if nodes[j][0] == key), None)
        if match is None:
            continue
        cursor = match + 1
        _, name, value = nodes[match]
        theirs = [v for v in _flat(value) if isinstance(v, torch.Tensor)]
        ours = [w for _, w in writes if isinstance(w, torch.Tensor)]
        pairs = [(a, b) for a, b in zip(ours, theirs, strict=False) if a.shape == b.shape]
        bad = [(a, b) for a, b in pairs if not _equal(a, b.to(a.dtype) if a.dtype != b.dtype else b)]
        if bad:
            if nan is not None and nan[0] <= step.index:
                return nan[1]
            worst = max(_diff(a, b) for a, b in bad)
            return (
                f"first at instruction {step.index} ({step.name}, Edge node {name}): max |diff| {worst:.4g}"
            )
    return "no single instruction's output differs from its Edge node; the outputs differ"
