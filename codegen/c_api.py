"""The C face of a program for a firmware build: a C header and its implementation over
ExecuTorch (``<name>_init`` / ``<name>_run``), the ``.pte`` embedded by an assembler
``.incbin`` in a named section, and the planned arenas, runtime pools and NPU working memory as
static buffers in named sections.

Why ``.incbin`` and not a C array: the bytes go into the object unchanged (a 2.7 MB program as
a C initializer is ~17 MB of source the compiler parses for a minute), the section and
alignment are one directive each, and the object depends on one file CMake can name. The
program is copied beside the generated ``.S`` under the validated name, so no user path ever
appears inside a generated file.

Every user string that reaches generated code (the C name, the C++ namespace, section names)
is checked here against a strict grammar and refused with one line naming it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from math import prod
from pathlib import Path
from typing import Any

from etforge import __version__
from etforge.codegen.pte import ProgramInfo, read_program
from etforge.core.common.errors import EtforgeError
from etforge.core.serialize.pte_check import check_pte

#: Alignment of the embedded program (ExecuTorch's segments are 16-aligned in etforge's ``.pte``).
PTE_ALIGNMENT = 16
#: Default sections: ``.rodata.*`` / ``.bss.*`` names fall into any linker script's generic
#: rules (and ``.bss.*`` is emitted NOBITS), while a script can still place them by name.
DEFAULT_PTE_SECTION = ".rodata.etforge_pte"
DEFAULT_ARENA_SECTION = ".bss.etforge_arena"
DEFAULT_NPU_SECTION = ".bss.etforge_npu"
#: Bytes ExecuTorch's temp allocator gets (kernels' ``allocate_temp``); *assumed*: the
#: CMSIS-NN scratch is planned inside the arena, and the portable kernels etforge selects
#: allocate no temp memory. ``<NAME>_TEMP_POOL_BYTES`` overrides it.
TEMP_POOL_BYTES = 4096

_C_KEYWORDS = frozenset(
    """auto break case char const continue default do double else enum extern float for goto if
    inline int long register restrict return short signed sizeof static struct switch typedef
    union unsigned void volatile while _Alignas _Alignof _Atomic _Bool _Complex _Generic
    _Imaginary _Noreturn _Static_assert _Thread_local alignas alignof and and_eq asm bitand
    bitor bool catch char8_t char16_t char32_t class compl concept consteval constexpr constinit
    const_cast co_await co_return co_yield decltype delete dynamic_cast explicit export false
    friend mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected
    public reinterpret_cast requires static_assert static_cast template this thread_local throw
    true try typeid typename using virtual wchar_t xor xor_eq main std""".split()
)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_SECTION = re.compile(r"\.?[A-Za-z_][A-Za-z0-9_.]{0,62}")

_C_TYPES = {
    "int8": "int8_t",
    "uint8": "uint8_t",
    "int16": "int16_t",
    "int32": "int32_t",
    "int64": "int64_t",
    "float32": "float",
    "float64": "double",
    "float16": "uint16_t",
    "bool": "uint8_t",
}
_BYTES = {"int8": 1, "uint8": 1, "bool": 1, "int16": 2, "float16": 2, "int32": 4, "float32": 4}
_BYTES |= {"int64": 8, "float64": 8}


def check_c_name(name: str, what: str = "NAME") -> str:
    """``name`` if it is a C identifier usable as a symbol prefix, else one error naming it."""
    if not _IDENT.fullmatch(name):
        raise EtforgeError(
            f"{what} {name!r} is not a C identifier ([A-Za-z_][A-Za-z0-9_]*, at most 63 characters)"
        )
    if name in _C_KEYWORDS:
        raise EtforgeError(f"{what} {name!r} is a C/C++ keyword; pick another name")
    if name.startswith("__") or re.match(r"_[A-Z]", name):
        raise EtforgeError(f"{what} {name!r} is reserved to the C implementation (starts with __ or _X)")
    return name


def check_namespace(namespace: str) -> str:
    parts = namespace.split("::")
    for part in parts:
        try:
            check_c_name(part, "NAMESPACE")
        except EtforgeError:
            raise EtforgeError(f"NAMESPACE {namespace!r} is not a C++ namespace of identifiers") from None
    return namespace


def check_section(section: str, what: str = "SECTION") -> str:
    if not _SECTION.fullmatch(section) or ".." in section:
        raise EtforgeError(f"{what} {section!r} is not a section name ([.]name of letters, digits, _ and .)")
    return section


@dataclass(frozen=True)
class Sections:
    pte: str = DEFAULT_PTE_SECTION
    arena: str = DEFAULT_ARENA_SECTION
    npu: str = DEFAULT_NPU_SECTION

    def checked(self) -> Sections:
        check_section(self.pte, "SECTION")
        check_section(self.arena, "ARENA_SECTION")
        check_section(self.npu, "NPU_SECTION")
        return self


def method_pool_estimate(program: Any, method: str) -> int:
    """Bytes ExecuTorch's method allocator needs for ``method`` -- an *estimate* from the plan:
    an EValue (16 B) per value, a TensorImpl with its sizes, dim order and strides per tensor,
    an instruction record and argument list per instruction, doubled and rounded up to 1 KiB.
    ``<NAME>_METHOD_POOL_BYTES`` overrides it; too small is ``ETFORGE_ERROR_MEMORY`` at init."""
    plan = next(p for p in program.execution_plan if p.name == method)
    total = 16 * len(plan.values)
    for v in plan.values:
        if type(getattr(v, "val", None)).__name__ == "Tensor":
            total += 48 + 9 * len(v.val.sizes)
    for chain in plan.chains:
        for ins in chain.instructions:
            args = getattr(ins.instr_args, "args", None) or []
            total += 16 + 4 * len(args)
    total += 8 * len(plan.operators) + 64 * len(plan.delegates) + 8 * (len(plan.inputs) + len(plan.outputs))
    return (2 * total + 1023) // 1024 * 1024


def _ios(method: Any, report: dict[str, Any] | None) -> list[dict[str, Any]]:
    quant = (report or {}).get("io_quant", {}) or {}
    ios = []
    for kind, tensors in (("input", method.inputs), ("output", method.outputs)):
        qs = quant.get(f"{kind}s") or []
        for i, t in enumerate(tensors):
            if t.dtype not in _C_TYPES:
                raise EtforgeError(f"{kind} {i} has dtype {t.dtype}, which the C API does not carry")
            q = qs[i] if i < len(qs) else None
            ios.append(
                {
                    "kind": kind,
                    "index": i,
                    "dtype": t.dtype,
                    "ctype": _C_TYPES[t.dtype],
                    "sizes": list(t.sizes),
                    "dim_order": list(t.dim_order),
                    "bytes": prod(t.sizes) * _BYTES[t.dtype],
                    "scale": None if q is None else repr(float(q["scale"])),
                    "zero_point": None if q is None else int(q["zero_point"]),
                }
            )
    return ios


def _method(program: ProgramInfo) -> Any:
    return next((m for m in program.methods if m.name == "forward"), program.methods[0])


def buffers(pte: Path, report: dict[str, Any] | None) -> dict[str, Any]:
    """What the C API allocates for ``pte``'s program (no files written): for the memory map."""
    program = read_program(pte)
    m = _method(program)
    return {
        "pte_bytes": program.size,
        "arenas": list(m.arena_bytes),
        "method_pool": method_pool_estimate(program.program, m.name),
        "temp_pool": TEMP_POOL_BYTES,
        "npu_working": int((report or {}).get("memory", {}).get("npu_working_bytes_max", 0) or 0),
    }


def generate_c_api(
    pte: Path,
    out_dir: Path,
    name: str,
    namespace: str,
    report: dict[str, Any] | None,
    sections: Sections = Sections(),
    check: bool = False,
) -> dict[str, bytes]:
    """Write ``<name>_api.h``, ``<name>_api.cpp``, ``<name>_pte.S`` and ``<name>.pte`` into
    ``out_dir`` (beside the registration ``generate`` wrote with prefix ``<name>_``)."""
    from etforge.codegen.generate import _env, _write

    check_c_name(name)
    check_namespace(namespace)
    sections = sections.checked()
    if report is None:
        raise EtforgeError(
            f"{pte}: no report.json beside it -- not a program `etforge compile` wrote "
            "(the C API takes its I/O quantization and NPU memory from the report)"
        )
    data = check_pte(pte, report)
    program = read_program(pte)
    m = _method(program)
    if m.delegates and not all(d for d in m.delegates):
        raise EtforgeError(f"{pte}: a delegate without a backend id")
    ios = _ios(m, report)
    ctx = {
        "version": __version__,
        "name": name,
        "NAME": name.upper(),
        "namespace": namespace,
        "method": m.name,
        "method_ident": re.sub(r"\W", "_", m.name),
        "inputs": [x for x in ios if x["kind"] == "input"],
        "outputs": [x for x in ios if x["kind"] == "output"],
        "arenas": list(m.arena_bytes),
        "pte_size": program.size,
        "pte_alignment": PTE_ALIGNMENT,
        "sections": sections,
        "method_pool": method_pool_estimate(program.program, m.name),
        "temp_pool": TEMP_POOL_BYTES,
        "npu_working": int(report.get("memory", {}).get("npu_working_bytes_max", 0) or 0),
        "delegates": sorted(set(m.delegates)),
        "target": str(report.get("target", "unknown")),
    }
    if not re.fullmatch(r"[\w.-]+", ctx["target"]):
        raise EtforgeError(f"{pte}: report.json target {ctx['target']!r} is not a target name")
    env = _env()
    files = {
        f"{name}_api.h": env.get_template("c_api.h.j2").render(ctx).encode(),
        f"{name}_api.cpp": env.get_template("c_api.cpp.j2").render(ctx).encode(),
        f"{name}_pte.S": env.get_template("pte_incbin.S.j2").render(ctx).encode(),
        f"{name}.pte": data,
    }
    _write(out_dir, files, check)
    return files
