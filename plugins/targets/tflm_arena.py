"""The TensorFlow Lite Micro arena a host-only partition needs on the Cortex-M33, at compile time.

A host-only imxrt700 / imxrt700cm partition (no Neutron microcode) runs on the device only in
TFLM with CMSIS-NN (``etforge run/verify --cpu-partitions``, ``runtime/firmware/tflm.py``),
whose ``MicroInterpreter`` takes one arena. This sizes it from the LiteRT flatbuffer alone:

* **planned** (TFLM's non-persistent head): every non-constant tensor, sized up to 16 bytes,
  alive from the op that writes it to the last op reading it (the partition's inputs from op
  0, its outputs to the last op), plus each op's CMSIS-NN scratch buffer (``_scratch``: the
  DSP, non-MVE sizes of the kernels TFLM calls for a Cortex-M33) alive during its op, placed
  by TFLM's ``GreedyMemoryPlanner`` rules (largest first, ties in request order; each at the
  lowest offset clear of the buffers alive at the same time);
* **persistent** (TFLM's tail) and the planner's own bookkeeping: upper bounds from TFLM's
  32-bit structure sizes (``PER_*`` constants; not measured per model).

The sum is an upper bound the device holds it to (``tests/test_firmware_tflm.py``: the bytes
TFLM reports used fit in it, every partition); it is etforge's figure, not NXP data.
"""

from __future__ import annotations

import math
from typing import Any

#: What the figure is, wherever it is shown (report.json, the summary, etforge_model.h).
NOTE = (
    "TensorFlow Lite Micro's arena when a host-only partition runs on the Cortex-M33 instead of the "
    "NPU (etforge run/verify --cpu-partitions): etforge's upper bound from the LiteRT graph "
    "(TFLM's planner rules, CMSIS-NN scratch, 32-bit structure sizes), not NXP data"
)
#: TFLM's buffer alignment (``MicroArenaBufferAlignment``) and the arena's own.
ALIGN = 16
#: Bounds of TFLM's persistent allocations on a 32-bit core, per item:
#: ``TfLiteEvalTensor`` (12 B) + its ``AllocationInfo`` during planning (24 B), per tensor;
PER_TENSOR = 40
#: ``NodeAndRegistration`` (44 B), the parsed builtin options (<= 64 B) and the kernel's
#: ``OpData`` (<= 160 B), per op, plus 8 B per output channel (per-channel multiplier, shift)
#: of the ops that keep them;
PER_OP = 272
PER_CHANNEL = 8
_PER_CHANNEL_OPS = ("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "TRANSPOSE_CONV")
#: the interpreter's ``TfLiteTensor`` (64 B) and its quantization arrays, per partition I/O;
PER_IO = 160
#: the planner's entry (requirements, sorted size and id, list entry, offset: 40 B) per buffer;
PER_BUFFER = 48
#: the allocator, its arena allocator and the planner object placed in the arena.
FIXED = 512


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _schema() -> Any:
    from ai_edge_litert import schema_py_generated as schema

    return schema


def _nbytes(t: Any) -> int:
    sizes = {0: 4, 1: 2, 2: 4, 3: 1, 4: 8, 6: 1, 7: 2, 9: 1, 10: 8, 16: 4}  # TensorType -> bytes
    return math.prod(int(d) for d in (t.shape if t.shape is not None else [])) * sizes.get(int(t.type), 4)


def _shape(t: Any) -> list[int]:
    return [int(d) for d in (t.shape if t.shape is not None else [])]


def _scratch(op: str, ins: list[Any], outs: list[Any]) -> int:
    """Bytes of the scratch buffer TFLM's kernel for ``op`` requests (an upper bound)."""
    if op in ("CONV_2D", "DEPTHWISE_CONV_2D") and len(ins) > 1 and ins[1] is not None:
        w = _shape(ins[1])  # [O, kh, kw, I] / [1, kh, kw, C]
        return 4 * math.prod(w[1:]) if len(w) == 4 else 0  # im2col in int16, two columns
    if op == "TRANSPOSE_CONV":
        return 4 * sum(math.prod(_shape(t)) for t in outs) + (
            4 * math.prod(_shape(ins[1])) if len(ins) > 1 else 0
        )
    if op == "AVERAGE_POOL_2D":
        return 4 * (_shape(outs[0])[-1] if outs and _shape(outs[0]) else 1)  # int32 sums per channel
    if op in ("MEAN", "SUM"):
        return 4 * max(1, math.prod(_shape(outs[0]))) + 64  # int32 sums, resolved axes
    if op == "BATCH_MATMUL":
        return sum(_nbytes(t) * 4 for t in ins[:2] if t is not None)  # transposed operands, sums
    if op == "FULLY_CONNECTED":
        return 4 * (_shape(outs[0])[-1] if outs and _shape(outs[0]) else 1)  # kernel sums
    return 0


def _greedy(buffers: list[tuple[int, int, int]]) -> int:
    """TFLM ``GreedyMemoryPlanner``: (size, first op, last op) -> the planned bytes."""
    order = sorted(range(len(buffers)), key=lambda i: -buffers[i][0])  # stable: ties in request order
    placed: list[tuple[int, int]] = []  # (offset, index), kept sorted by offset
    top = 0
    for i in order:
        size, first, last = buffers[i]
        candidate = 0
        for off, j in placed:
            if buffers[j][2] < first or buffers[j][1] > last:
                continue  # not alive at the same time
            if off - candidate >= size:
                break
            candidate = max(candidate, off + buffers[j][0])
        placed.append((candidate, i))
        placed.sort()
        top = max(top, candidate + size)
    return top


def arena_bytes(model: bytes) -> int:
    """The TFLM arena for the LiteRT flatbuffer ``model`` (module doc), in bytes."""
    schema = _schema()
    m = schema.ModelT.InitFromPackedBuf(bytearray(model), 0)
    names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    total = FIXED
    for g in m.subgraphs:
        tensors = g.tensors or []
        ops = g.operators or []
        const = {
            i for i, t in enumerate(tensors) if t.buffer and m.buffers[t.buffer].data is not None
            and len(m.buffers[t.buffer].data) > 0
        }  # fmt: skip
        last = max(len(ops) - 1, 0)
        span: dict[int, list[int]] = {}
        for t in [int(x) for x in (g.inputs if g.inputs is not None else [])]:
            span[t] = [0, 0]
        for k, op in enumerate(ops):
            for t in [int(x) for x in (op.outputs if op.outputs is not None else []) if x >= 0]:
                span.setdefault(t, [k, k])
            for t in [int(x) for x in (op.inputs if op.inputs is not None else []) if x >= 0]:
                if t not in const:
                    s = span.setdefault(t, [0, k])
                    s[1] = max(s[1], k)
        for t in [int(x) for x in (g.outputs if g.outputs is not None else [])]:
            span.setdefault(t, [last, last])[1] = last  # alive to the end
        buffers = [
            (_align(_nbytes(tensors[t])), s[0], s[1]) for t, s in sorted(span.items()) if t not in const
        ]
        channels = 0
        for k, op in enumerate(ops):
            oc = m.operatorCodes[op.opcodeIndex]
            name = names.get(max(int(oc.builtinCode), int(oc.deprecatedBuiltinCode)), "")
            ins = [tensors[int(x)] if x >= 0 else None for x in (op.inputs if op.inputs is not None else [])]
            outs = [tensors[int(x)] for x in (op.outputs if op.outputs is not None else [])]
            scratch = _scratch(name, ins, outs)
            if scratch:
                buffers.append((_align(scratch), k, k))
            if name in _PER_CHANNEL_OPS:  # TFLM keeps a multiplier and a shift per output channel
                channels += sum(_shape(t)[-1] if _shape(t) else 1 for t in outs)
        total += _align(_greedy(buffers))
        total += PER_TENSOR * len(tensors) + PER_OP * len(ops) + PER_CHANNEL * channels
        total += PER_BUFFER * len(buffers)
        total += PER_IO * (
            len(g.inputs if g.inputs is not None else []) + len(g.outputs if g.outputs is not None else [])
        )
    return _align(total)
