"""Working memory of each NPU partition: offset planning over its LiteRT tensors' lifetimes.

ExecuTorch's arena holds only the CPU side of the program (a delegate's inputs and
outputs); what the NPU partition needs while it runs is not in it. This plans every
non-constant tensor of the partition's LiteRT graph at an offset in one buffer with the same
best-fit placement as the CPU arena (``core.serialize.memory_plan``): a tensor lives from the op that
produces it to its last consumer, graph inputs and outputs for the whole partition.

It is etforge's host estimate from the LiteRT graph: an NPU compiler may fuse and tile ops, so
the figure on the device is the one it reports; the compiler plugin says so in its
``memory_note``. Constant tensors (weights) are in flash with the payload, not counted here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from etforge.core.contracts.target import TargetSpec
    from etforge.core.registry.manager import Registry

#: Offsets are aligned like the LiteRT constant buffers and the ExecuTorch arena (16 bytes).
ALIGNMENT = 16

#: What the figure is, said wherever it is shown (report, CLI, header), before the NPU
#: compiler's ``memory_note`` (see :func:`source`).
ESTIMATE = "etforge's host estimate from the LiteRT graph (offset planning over its tensors' lifetimes)"


@dataclass(eq=False)
class PlannedTensor:
    """One non-constant LiteRT tensor: the attributes ``memory_plan``'s placement reads."""

    index: int
    name: str
    allocated_memory: int
    lifetime: tuple[int, int]  # first and last op index that touches it (inclusive)
    mem_id: int = 1
    offset: int = 0


@dataclass
class PartitionMemory:
    name: str
    working_bytes: int  # the planned buffer: max(offset + size)
    lower_bound: int  # peak of bytes alive at once: no plan can use less
    peak_op: int  # the op index at that peak
    tensors: list[PlannedTensor] = field(default_factory=list)
    #: What the figure is (:func:`source`).
    source: str = ESTIMATE

    def as_dict(self) -> dict[str, Any]:
        peak = sorted(
            (t for t in self.tensors if t.lifetime[0] <= self.peak_op <= t.lifetime[1]),
            key=lambda t: (-t.allocated_memory, t.index),
        )
        return {
            "name": self.name,
            "working_bytes": self.working_bytes,
            "lower_bound_bytes": self.lower_bound,
            "planned_tensors": len(self.tensors),
            "peak_op": self.peak_op,
            "peak_live": [t.name for t in peak[:8]],
        }


def _size(tensor: Any, schema: Any) -> int:
    """Bytes of one tensor; a type numpy does not name (int4, string, resource) counts as 4
    bytes per element: an over-estimate, never an under-estimate."""
    names = {v: k for k, v in vars(schema.TensorType).items() if not k.startswith("_")}
    try:
        itemsize = np.dtype(names.get(tensor.type, "unknown").lower().replace("bool", "bool_")).itemsize
    except TypeError:
        itemsize = 4
    shape = [int(d) for d in (tensor.shape if tensor.shape is not None else [])]
    return int(np.prod(shape, dtype=np.int64)) * itemsize


def lifetimes(model_bytes: bytes) -> list[PlannedTensor]:
    """The non-constant tensors of the model's first subgraph with their lifetimes."""
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(model_bytes, 0)
    sg = model.subgraphs[0]
    ops = sg.operators or []
    last = max(len(ops) - 1, 0)
    span: dict[int, list[int]] = {}

    def touch(index: int, at: int) -> None:
        s = span.setdefault(index, [at, at])
        s[0], s[1] = min(s[0], at), max(s[1], at)

    for i, op in enumerate(ops):
        for t in list(op.inputs if op.inputs is not None else []) + list(
            op.outputs if op.outputs is not None else []
        ):
            if t >= 0:
                touch(int(t), i)
    for t in list(sg.inputs if sg.inputs is not None else []) + list(
        sg.outputs if sg.outputs is not None else []
    ):
        touch(int(t), 0)
        touch(int(t), last)  # the partition's I/O lives for the whole call
    out = []
    for index in sorted(span):
        tensor = sg.tensors[index]
        buffer = model.buffers[tensor.buffer] if tensor.buffer else None
        if buffer is not None and buffer.data is not None and len(buffer.data) > 0:
            continue  # a constant: in flash with the payload
        name = tensor.name.decode() if isinstance(tensor.name, bytes) else str(tensor.name)
        out.append(PlannedTensor(index, name, _size(tensor, schema), (span[index][0], span[index][1])))
    return out


def source(target: TargetSpec, reg: Registry | None = None) -> str:
    """What a partition's figure is on ``target``: the estimate, and the NPU compiler's note."""
    from etforge.core.registry.manager import registry

    name = target.npu.compiler if target.npu is not None else None
    compiler = (reg or registry()).npu_compilers.get(name) if name else None
    note = compiler.memory_note if compiler is not None else ""
    return f"{ESTIMATE}; {note}" if note else ESTIMATE


def plan_partition(name: str, model_bytes: bytes, source: str = ESTIMATE) -> PartitionMemory:
    """Place the partition's tensors (best-fit, a few orders, the smallest plan wins)."""
    from etforge.core.serialize.placement import _ORDERS, _align, _place

    tensors = lifetimes(model_bytes)
    best: dict[Any, int] = {}
    best_size = -1
    for key in _ORDERS:
        offsets = _place(sorted(tensors, key=key), ALIGNMENT)
        size = max((off + t.allocated_memory for t, off in offsets.items()), default=0)
        if best_size < 0 or size < best_size:  # first of equals: deterministic
            best, best_size = offsets, size
    for t in tensors:
        t.offset = best.get(t, 0)
    peak, peak_op = 0, 0
    for step in sorted({t.lifetime[0] for t in tensors}):
        live = sum(t.allocated_memory for t in tensors if t.lifetime[0] <= step <= t.lifetime[1])
        if live > peak:
            peak, peak_op = live, step
    return PartitionMemory(name, _align(max(best_size, 0), ALIGNMENT), peak, peak_op, tensors, source)


def plan_partitions(partitions: list[tuple[str, bytes]], source: str = ESTIMATE) -> list[PartitionMemory]:
    """One plan per (partition name, LiteRT flatbuffer)."""
    return [plan_partition(name, tflite, source) for name, tflite in partitions]


def plan_result(result: Any) -> list[PartitionMemory]:
    """The plans of a compile's NPU partitions (``CompileResult.partitions``), in order."""
    parts = [(p.name, p.converted.tflite) for p in result.partitions]
    return plan_partitions(parts, source(result.target)) if parts else []


def report_section(plans: list[PartitionMemory]) -> dict[str, Any]:
    """``report.json``'s ``memory`` additions: per partition, and what the figures are."""
    return {
        "npu_partitions": [p.as_dict() for p in plans],
        "npu_working_bytes_max": max((p.working_bytes for p in plans), default=0),
        "npu_source": plans[0].source if plans else ESTIMATE,
    }
