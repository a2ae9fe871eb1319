"""What the firmware is given, read from the program (``.pte``) itself, never from report.json.

The header's I/O quantization, CMSIS-NN scratch and NPU working memory are facts of the
program: the first quantize of each input and the last dequantize of each output carry their
scale and zero point, a kernel's scratch buffer is a planned 1-D uint8 tensor it takes as an
argument, and a host-only NPU partition's LiteRT model is in its delegate payload (its working
memory is planned the way the compile planned it). ``etforge verify`` checks report.json's copy
of each against these (:mod:`etforge.runtime.verification.report_fields`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: ExecuTorch's ScalarType code for uint8 (a kernel's scratch buffer).
_UINT8 = 0


@dataclass(frozen=True)
class Quant:
    scale: float
    zero_point: int


def _kernel_calls(plan: Any) -> list[tuple[str, list[int]]]:
    """(operator name without overload, argument value indices) of each kernel call, in order."""
    calls = []
    for chain in plan.chains:
        for ins in chain.instructions:
            args = ins.instr_args
            if hasattr(args, "op_index"):
                calls.append((str(plan.operators[args.op_index].name), [int(a) for a in args.args]))
    return calls


def _scalar(plan: Any, index: int, kind: str) -> Any:
    val = plan.values[index].val
    return getattr(val, kind, None) if type(val).__name__ in ("Double", "Int") else None


def _quant(plan: Any, args: list[int]) -> Quant | None:
    if len(args) < 3:
        return None
    scale, zero = _scalar(plan, args[1], "double_val"), _scalar(plan, args[2], "int_val")
    if not isinstance(scale, float) or not isinstance(zero, int) or isinstance(zero, bool):
        return None
    return Quant(float(scale), int(zero))


def io_quant(plan: Any) -> tuple[list[Quant | None], list[Quant | None]]:
    """Each input's first quantize and each output's dequantize (scalar scale: per tensor)."""
    calls = _kernel_calls(plan)

    def short(name: str) -> str:
        return name.rpartition("::")[2]

    inputs = []
    for v in plan.inputs:
        q = next((c for c in calls if short(c[0]) == "quantize_per_tensor" and c[1][:1] == [int(v)]), None)
        inputs.append(_quant(plan, q[1]) if q is not None else None)
    outputs = []
    for v in plan.outputs:
        dq = next(
            (c for c in calls if short(c[0]) == "dequantize_per_tensor" and c[1][-1:] == [int(v)]), None
        )
        outputs.append(_quant(plan, dq[1]) if dq is not None else None)
    return inputs, outputs


def scratch_bytes(plan: Any) -> int:
    """Bytes of the kernels' scratch buffers: planned 1-D uint8 tensors passed to a kernel
    other than as the value it writes (its last argument)."""
    seen: set[int] = set()
    total = 0
    for _, args in _kernel_calls(plan):
        for a in args[:-1]:
            val = plan.values[a].val
            if (
                a not in seen
                and type(val).__name__ == "Tensor"
                and int(getattr(val.scalar_type, "value", val.scalar_type)) == _UINT8
                and len(val.sizes) == 1
                and val.allocation_info is not None
            ):
                seen.add(a)
                total += int(val.sizes[0])
    return total


def delegate_partition(program: Any, delegate: Any) -> str | None:
    """The partition a delegate runs: etforge's container names it; a device payload is named
    by the compile spec the partitioner gave it, which the ``.pte`` keeps with the delegate.
    This, not the delegate's position, is how a delegate meets its report.json entry:
    ExecuTorch emits delegates in program order, the report lists partitions in tag order."""
    from etforge.core.litert import payload

    data = bytes(program.backend_delegate_data[delegate.processed.index].data)
    if data[:4] == payload.MAGIC:
        return payload.unpack(data).partition
    for spec in getattr(delegate, "compile_specs", None) or []:
        if spec.key == payload.PARTITION_SPEC:
            value = spec.value
            return bytes(value).decode() if not isinstance(value, str) else value
    return None


def npu_working(program: Any) -> list[tuple[str | None, int | None]]:
    """(partition, working bytes) of each NPU delegate, in program order: planned from a
    host-only payload's LiteRT model; None for a device payload's figure (the NPU compiler's,
    not in the program) and for the name of a delegate that carries none."""
    from etforge.core.litert import payload
    from etforge.core.serialize.npu_memory import plan_partition

    out: list[tuple[str | None, int | None]] = []
    for plan in program.execution_plan:
        for d in plan.delegates:
            data = bytes(program.backend_delegate_data[d.processed.index].data)
            name = delegate_partition(program, d)
            if data[:4] != payload.MAGIC:
                out.append((name, None))
                continue
            blob = payload.unpack(data)
            working = plan_partition(blob.partition, blob.data).working_bytes if blob.host_only else None
            out.append((name, working))
    return out


def fallback_arenas(program: Any) -> list[int | None]:
    """Each delegate's TensorFlow Lite Micro arena when it runs on the CPU instead of the NPU
    (a host-only payload's LiteRT model, ``plugins/targets/tflm_arena.py``: the figure
    report.json states), in program order; None for a device payload (it runs on the NPU)."""
    from etforge.core.litert import payload
    from etforge.plugins.targets.tflm_arena import arena_bytes

    out: list[int | None] = []
    for plan in program.execution_plan:
        for d in plan.delegates:
            data = bytes(program.backend_delegate_data[d.processed.index].data)
            blob = payload.unpack(data) if data[:4] == payload.MAGIC else None
            out.append(arena_bytes(blob.data) if blob is not None and blob.host_only else None)
    return out
