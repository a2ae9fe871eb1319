"""Reading a ``.pte`` without torch: ExecuTorch's own flatbuffer accessors, loaded on their own.

``executorch.exir.schema`` and ``deserialize_pte_binary`` live under ``executorch.exir``,
whose package ``__init__`` imports torch (seconds). The accessor classes ExecuTorch generated
from its ``program.fbs`` (``exir/_serialize/generated``) need only the ``flatbuffers``
package, so a command that reads a program but runs no model (``etforge codegen``) loads
those alone and gets a read-only view with the schema's field names (``execution_plan``,
``values[i].val.sizes`` ...). Delegate segments are folded back inline, as
``deserialize_pte_binary`` does, so readers see the same ``backend_delegate_data``.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

_PKG = "executorch.exir._serialize.generated.executorch_flatbuffer"
#: The generated classes the view reads.
_CLASSES = (
    "Program",
    "Tensor",
    "Int",
    "Bool",
    "Double",
    "KernelCall",
    "DelegateCall",
    "KernelTypes",
    "InstructionArguments",
)
#: ``DataLocation`` of ``program.fbs``: delegate data inline in the program, or in a segment.
INLINE, SEGMENT = 0, 1

#: The extended header ("eh00") after the flatbuffer's root offset and file identifier, as
#: ExecuTorch's ``_ExtendedHeader`` lays it out: magic, length (u32), program size, segment
#: base offset, then (when length says so) segment data size (u64 each), little-endian.
_EH_MAGIC = b"eh00"
_EH_MIN_LENGTH = 4 + 4 + 8 + 8
_EH_LENGTH = _EH_MIN_LENGTH + 8


@dataclass(frozen=True)
class ExtendedHeader:
    program_size: int
    segment_base_offset: int
    segment_data_size: int


def extended_header(data: bytes) -> ExtendedHeader | None:
    """The program's extended header, or None when absent or malformed (ExecuTorch's reading)."""
    head = data[8 : 8 + _EH_LENGTH]
    if len(head) < _EH_LENGTH or head[:4] != _EH_MAGIC:
        return None
    length = int.from_bytes(head[4:8], "little")
    if length < _EH_MIN_LENGTH:
        return None
    seg_size = int.from_bytes(head[24:32], "little") if length > _EH_MIN_LENGTH else 0
    return ExtendedHeader(
        int.from_bytes(head[8:16], "little"), int.from_bytes(head[16:24], "little"), seg_size
    )


@lru_cache(maxsize=1)
def _generated() -> dict[str, Any]:
    """The generated accessor classes, without running ``executorch/exir/__init__.py``.

    When ``executorch.exir`` is already imported (a compile, verify), the ordinary import.
    Otherwise its two parent packages stand as empty placeholders while the generated modules
    load, and every module added under ``executorch.exir`` is taken out of ``sys.modules``
    afterwards: a later ``import executorch.exir`` runs as if this never happened.
    """
    if "executorch.exir" in sys.modules:
        return _classes()
    spec = importlib.util.find_spec("executorch")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("executorch is not installed")
    exir = Path(list(spec.submodule_search_locations)[0]) / "exir"
    before = set(sys.modules)
    try:
        for name, path in (("executorch.exir", exir), ("executorch.exir._serialize", exir / "_serialize")):
            placeholder = types.ModuleType(name)
            placeholder.__path__ = [str(path)]
            sys.modules[name] = placeholder
        return _classes()
    finally:
        for name in [m for m in sys.modules if m not in before]:
            if name == "executorch.exir" or name.startswith("executorch.exir."):
                del sys.modules[name]


def _classes() -> dict[str, Any]:
    """Each generated module's names bound to classes, not to the sibling modules of the same
    name an import cycle can leave there (what ExecuTorch's own reader patches the same way)."""
    package = importlib.import_module(_PKG)
    for module in [m for m in vars(package).values() if isinstance(m, types.ModuleType)]:
        for name, value in list(vars(module).items()):
            if isinstance(value, types.ModuleType) and isinstance(getattr(value, name, None), type):
                setattr(module, name, getattr(value, name))
    return {n: getattr(importlib.import_module(f"{_PKG}.{n}"), n) for n in _CLASSES}


# The view: ExecuTorch's schema names (executorch/exir/schema.py) for what etforge reads.
@dataclass(frozen=True)
class AllocationDetails:
    memory_id: int
    memory_offset_low: int
    memory_offset_high: int


@dataclass(frozen=True)
class Tensor:
    scalar_type: int
    sizes: list[int]
    dim_order: list[int]
    allocation_info: AllocationDetails | None


@dataclass(frozen=True)
class Int:
    int_val: int


@dataclass(frozen=True)
class Bool:
    bool_val: bool


@dataclass(frozen=True)
class Double:
    double_val: float | str  # "inf" / "-inf" as ExecuTorch's schema.Double stores them


@dataclass(frozen=True)
class Other:
    """A value or instruction this view does not open (lists, strings, moves, jumps, frees)."""

    kind: int


@dataclass(frozen=True)
class EValue:
    val: Any


@dataclass(frozen=True)
class KernelCall:
    op_index: int
    args: list[int]


@dataclass(frozen=True)
class DelegateCall:
    delegate_index: int
    args: list[int]


@dataclass(frozen=True)
class Instruction:
    instr_args: Any


@dataclass(frozen=True)
class Chain:
    instructions: list[Instruction]


@dataclass(frozen=True)
class Operator:
    name: str
    overload: str


@dataclass
class BackendDelegateDataReference:
    location: int
    index: int


@dataclass(frozen=True)
class CompileSpec:
    key: str
    value: bytes


@dataclass
class BackendDelegate:
    id: str
    processed: BackendDelegateDataReference
    #: What the partitioner gave the backend, kept in the program (etforge's partition name).
    compile_specs: list[CompileSpec] = field(default_factory=list)


@dataclass(frozen=True)
class BackendDelegateInlineData:
    data: bytes


@dataclass(frozen=True)
class ExecutionPlan:
    name: str
    values: list[EValue]
    inputs: list[int]
    outputs: list[int]
    chains: list[Chain]
    operators: list[Operator]
    delegates: list[BackendDelegate]
    non_const_buffer_sizes: list[int]


@dataclass(frozen=True)
class Program:
    execution_plan: list[ExecutionPlan]
    backend_delegate_data: list[BackendDelegateInlineData]


def _ints(obj: Any, field: str) -> list[int]:
    get = getattr(obj, field)
    return [int(get(j)) for j in range(getattr(obj, f"{field}Length")())]


def _str(value: bytes | str | None) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")


def _ubytes(table: Any, slot: int) -> bytes:
    """A ``[ubyte]`` field as one slice (not a call per byte)."""
    o = table.Offset(slot)
    if not o:
        return b""
    start = table.Vector(o)
    return bytes(table.Bytes[start : start + table.VectorLen(o)])


def _init(cls: Any, table: Any) -> Any:
    obj = cls()
    obj.Init(table.Bytes, table.Pos)
    return obj


def _value(g: dict[str, Any], ev: Any) -> Any:
    kind, table = ev.ValType(), ev.Val()
    types_ = g["KernelTypes"]
    if kind == types_.Tensor:
        t = _init(g["Tensor"], table)
        a = t.AllocationInfo()
        alloc = (
            None if a is None else AllocationDetails(a.MemoryId(), a.MemoryOffsetLow(), a.MemoryOffsetHigh())
        )
        return Tensor(int(t.ScalarType()), _ints(t, "Sizes"), _ints(t, "DimOrder"), alloc)
    if kind == types_.Int:
        return Int(int(_init(g["Int"], table).IntVal()))
    if kind == types_.Bool:
        return Bool(bool(_init(g["Bool"], table).BoolVal()))
    if kind == types_.Double:
        d = float(_init(g["Double"], table).DoubleVal())
        return Double("inf" if d == float("inf") else "-inf" if d == float("-inf") else d)
    return Other(int(kind))


def _instruction(g: dict[str, Any], ins: Any) -> Instruction:
    kind, table = ins.InstrArgsType(), ins.InstrArgs()
    args = g["InstructionArguments"]
    if kind == args.KernelCall:
        k = _init(g["KernelCall"], table)
        return Instruction(KernelCall(int(k.OpIndex()), _ints(k, "Args")))
    if kind == args.DelegateCall:
        d = _init(g["DelegateCall"], table)
        return Instruction(DelegateCall(int(d.DelegateIndex()), _ints(d, "Args")))
    return Instruction(Other(int(kind)))


def _plan(g: dict[str, Any], p: Any) -> ExecutionPlan:
    chains = []
    for c in (p.Chains(i) for i in range(p.ChainsLength())):
        chains.append(Chain([_instruction(g, c.Instructions(j)) for j in range(c.InstructionsLength())]))
    delegates = []
    for d in (p.Delegates(i) for i in range(p.DelegatesLength())):
        ref = d.Processed()
        specs = [
            CompileSpec(_str(c.Key()), _ubytes(c._tab, 6))
            for c in (d.CompileSpecs(j) for j in range(d.CompileSpecsLength()))
        ]
        delegates.append(
            BackendDelegate(_str(d.Id()), BackendDelegateDataReference(ref.Location(), ref.Index()), specs)
        )
    return ExecutionPlan(
        name=_str(p.Name()),
        values=[EValue(_value(g, p.Values(i))) for i in range(p.ValuesLength())],
        inputs=_ints(p, "Inputs"),
        outputs=_ints(p, "Outputs"),
        chains=chains,
        operators=[
            Operator(_str(o.Name()), _str(o.Overload()))
            for o in (p.Operators(i) for i in range(p.OperatorsLength()))
        ],
        delegates=delegates,
        non_const_buffer_sizes=_ints(p, "NonConstBufferSizes"),
    )


def read(data: bytes) -> Program:
    """The program in ``data`` (a whole ``.pte``); raises on a truncated or corrupt file."""
    g = _generated()
    header = extended_header(data)
    size = header.program_size if header is not None else len(data)
    root = g["Program"].GetRootAs(data[:size], 0)
    plans = [_plan(g, root.ExecutionPlan(i)) for i in range(root.ExecutionPlanLength())]
    inline = [
        BackendDelegateInlineData(_ubytes(root.BackendDelegateData(i)._tab, 4))
        for i in range(root.BackendDelegateDataLength())
    ]
    base = header.segment_base_offset if header is not None else 0
    if base:  # as ExecuTorch's _restore_delegates: each segment payload appended inline
        segments = []
        for i in range(root.SegmentsLength()):
            s = root.Segments(i)
            start, length = base + int(s.Offset()), int(s.Size())
            if start + length > len(data):
                raise ValueError(f"segment {i} overflows the file ({start + length} > {len(data)} bytes)")
            segments.append(data[start : start + length])
        for plan in plans:
            for d in plan.delegates:
                if d.processed.location == INLINE:
                    continue
                if d.processed.location != SEGMENT or d.processed.index >= len(segments):
                    raise ValueError(
                        f"delegate {d.id!r} refers to segment {d.processed.index} of {len(segments)}"
                    )
                inline.append(BackendDelegateInlineData(segments[d.processed.index]))
                d.processed = BackendDelegateDataReference(INLINE, len(inline) - 1)
    return Program(plans, inline)
