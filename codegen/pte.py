"""Reading a ``.pte`` with ExecuTorch's own program schema: operators, I/O, memory, delegates.

Read through :mod:`etforge.core.serialize.pte_read` (ExecuTorch's generated flatbuffer
accessors, without torch): ``etforge codegen`` starts in well under a second."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from etforge.core.common.errors import EtforgeError

_DTYPES = {
    0: "uint8",
    1: "int8",
    2: "int16",
    3: "int32",
    4: "int64",
    5: "float16",
    6: "float32",
    7: "float64",
    11: "bool",
}


@dataclass(frozen=True)
class TensorInfo:
    sizes: tuple[int, ...]
    dtype: str
    dim_order: tuple[int, ...]


@dataclass
class MethodInfo:
    name: str
    operators: list[str]
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    arena_bytes: list[int]  # per memory id 1..n
    delegates: list[str]


@dataclass
class ProgramInfo:
    path: str
    size: int
    methods: list[MethodInfo] = field(default_factory=list)
    #: The parsed schema ``Program``, for readers of the same file (one parse per codegen).
    program: Any = field(default=None, repr=False, compare=False)

    @property
    def operators(self) -> list[str]:
        return sorted({op for m in self.methods for op in m.operators})


def _tensor(value: object) -> TensorInfo | None:
    val = getattr(value, "val", None)
    if type(val).__name__ != "Tensor":
        return None
    dtype = _DTYPES.get(int(getattr(val.scalar_type, "value", val.scalar_type)), str(val.scalar_type))
    return TensorInfo(tuple(int(s) for s in val.sizes), dtype, tuple(int(d) for d in val.dim_order))


def read_program(path: Path) -> ProgramInfo:
    """Parse ``path``; a file that is not a complete ``.pte`` is an error naming it."""
    if not path.is_file():
        raise EtforgeError(f"{path} does not exist")
    data = path.read_bytes()
    if len(data) < 8 or data[4:6] != b"ET":
        raise EtforgeError(f"{path} is not an ExecuTorch program (no 'ET' file identifier)")
    from etforge.core.serialize import pte_read

    try:
        program = pte_read.read(data)
    except Exception as exc:
        raise EtforgeError(
            f"{path}: cannot read the program (truncated or corrupt?): {type(exc).__name__}: {exc}"
        ) from None
    info = ProgramInfo(str(path), len(data), program=program)
    for plan in program.execution_plan:
        ops = [f"{o.name}.{o.overload}" if o.overload else o.name for o in plan.operators]
        info.methods.append(
            MethodInfo(
                name=plan.name,
                operators=sorted(set(ops)),
                inputs=[t for i in plan.inputs if (t := _tensor(plan.values[i])) is not None],
                outputs=[t for i in plan.outputs if (t := _tensor(plan.values[i])) is not None],
                arena_bytes=[int(b) for b in plan.non_const_buffer_sizes[1:]],
                delegates=[d.id for d in plan.delegates],
            )
        )
    return info
