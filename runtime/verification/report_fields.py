"""A verify gate: every report.json field that reaches the firmware is the program's own.

``etforge codegen`` reads I/O quantization, shapes, arena, scratch and NPU working memory from
the ``.pte`` (:mod:`etforge.codegen.program_facts`); report.json carries copies for people and
tools. A copy that differs from the program (a forged scale, an arena edited smaller) is a
failure naming the field, before anything else is verified.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from etforge.core.common.errors import EtforgeError

#: ExecuTorch ScalarType codes → report.json's dtype names.
_DTYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32", 7: "float64", 11: "bool"}  # fmt: skip


def mismatches(program: Any, pte: Path, report: dict[str, Any]) -> list[str]:
    """One line per report.json field that differs from the program (``program``: the
    ``.pte``'s parsed schema ``Program``)."""
    from etforge.codegen import program_facts

    plan = program.execution_plan[0]
    found: list[str] = []

    def check(field: str, reported: Any, actual: Any) -> None:
        same = reported == actual
        if isinstance(reported, float) and isinstance(actual, float):
            same = reported == actual or (math.isnan(reported) and math.isnan(actual))
        if not same:
            found.append(f"report.json {field} is {reported!r}, the program ({pte.name}) has {actual!r}")

    memory = report.get("memory") if isinstance(report.get("memory"), dict) else {}
    check("memory.pte_bytes", memory.get("pte_bytes"), pte.stat().st_size)
    check("memory.arena_bytes", memory.get("arena_bytes"), [int(b) for b in plan.non_const_buffer_sizes[1:]])
    scratch = memory.get("scratch", [])
    reported_scratch = (
        sum(x.get("bytes", 0) for x in scratch if isinstance(x, dict))
        if isinstance(scratch, list)
        else scratch
    )
    check("memory.scratch (bytes, summed)", reported_scratch, program_facts.scratch_bytes(plan))
    q_in, q_out = program_facts.io_quant(plan)
    io = report.get("io_quant") if isinstance(report.get("io_quant"), dict) else {}
    for kind, actual in (("inputs", q_in), ("outputs", q_out)):
        listed = io.get(kind)
        if not isinstance(listed, list) or len(listed) != len(actual):
            check(
                f"io_quant.{kind} (count)", len(listed) if isinstance(listed, list) else listed, len(actual)
            )
            continue
        for i, (rep, q) in enumerate(zip(listed, actual, strict=True)):
            if q is None or rep is None:
                check(f"io_quant.{kind}[{i}]", rep, None if q is None else vars(q))
                continue
            rep = rep if isinstance(rep, dict) else {}
            check(f"io_quant.{kind}[{i}].scale", rep.get("scale"), q.scale)
            check(f"io_quant.{kind}[{i}].zero_point", rep.get("zero_point"), q.zero_point)
    for kind, values in (("inputs", plan.inputs), ("outputs", plan.outputs)):
        tensors = [plan.values[v].val for v in values if type(plan.values[v].val).__name__ == "Tensor"]
        listed = report.get(kind)
        if isinstance(listed, list):  # a constant output (None, a number) is no tensor of the program
            listed = [e for e in listed if not (isinstance(e, dict) and "constant" in e)]
        if not isinstance(listed, list) or len(listed) != len(tensors):
            check(f"{kind} (count)", len(listed) if isinstance(listed, list) else listed, len(tensors))
            continue
        for i, (rep, t) in enumerate(zip(listed, tensors, strict=True)):
            rep = rep if isinstance(rep, dict) else {}
            check(f"{kind}[{i}].shape", rep.get("shape"), [int(s) for s in t.sizes])
            code = int(getattr(t.scalar_type, "value", t.scalar_type))
            check(f"{kind}[{i}].dtype", rep.get("dtype"), _DTYPES.get(code, str(t.scalar_type)))
    parts = memory.get("npu_partitions", [])
    working = program_facts.npu_working(program)
    if not isinstance(parts, list) or len(parts) != len(working):
        check("memory.npu_partitions (count)", len(parts) if isinstance(parts, list) else parts, len(working))
    else:
        # Matched by partition name, never by position: ExecuTorch emits the delegates in
        # program order, the report lists the partitions in tag order (etforge_0, etforge_1, ...).
        by_name = {rep.get("name"): i for i, rep in enumerate(parts) if isinstance(rep, dict)}
        arenas = program_facts.fallback_arenas(program)
        for k, ((name, size), arena) in enumerate(zip(working, arenas, strict=True)):
            if name is None:
                found.append(
                    f"report.json memory.npu_partitions: delegate {k} of {pte.name} names no partition"
                )
                continue
            if name not in by_name:
                check(f"memory.npu_partitions (delegate {k}'s partition)", None, name)
                continue
            i = by_name[name]
            rep = parts[i]
            if size is not None:  # a device payload's figure (the NPU compiler's) is not in the program
                check(f"memory.npu_partitions[{i}].working_bytes", rep.get("working_bytes"), size)
            if "fallback_arena_bytes" in rep:  # a host-only partition's
                check(f"memory.npu_partitions[{i}].fallback_arena_bytes", rep["fallback_arena_bytes"], arena)
        sizes = [p.get("working_bytes") for p in parts if isinstance(p, dict)]
        if all(isinstance(s, int) for s in sizes):
            check("memory.npu_working_bytes_max", memory.get("npu_working_bytes_max"), max(sizes, default=0))
    return found


def refuse_forged(program: Any, pte: Path, report: dict[str, Any]) -> None:
    """Raise one line naming the first field report.json does not share with the program."""
    found = mismatches(program, pte, report)
    if found:
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise EtforgeError(f"{found[0]}{more}: report.json does not describe this program")
