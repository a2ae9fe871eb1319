"""``etforge codegen``: from a ``.pte`` (and its report) to the sources a firmware build compiles."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from etforge import __version__
from etforge.codegen import escape, program_facts
from etforge.codegen.delegates import read_delegates
from etforge.codegen.kernels import catalogue, library_sizes
from etforge.codegen.pte import ProgramInfo, read_program
from etforge.codegen.registration import KernelEntry, build_entry
from etforge.core.common.errors import EtforgeError
from etforge.core.serialize.pte_check import check_pte

PTE_ALIGNMENT = 16


@dataclass
class CodegenResult:
    files: dict[str, bytes]
    registered: list[str]
    missing: list[str]
    per_library: dict[str, tuple[int, int]]  # library -> (registered, full build)
    changed: list[str] = field(default_factory=list)


def _env() -> jinja2.Environment:
    return escape.install(
        jinja2.Environment(
            loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=True,
        )
    )


def _float_literal(value: float) -> str:
    return f"{value!r}f" if "e" in repr(value) or "." in repr(value) else f"{value!r}.0f"


def _io(program: ProgramInfo) -> list[dict[str, Any]]:
    """Each method's inputs and outputs as the program holds them: shape, dim order, and the
    scale and zero point of their quantize / dequantize (never report.json's copy)."""
    methods = []
    for m, plan in zip(program.methods, program.program.execution_plan, strict=True):
        q_in, q_out = program_facts.io_quant(plan)
        quants = {
            "input": [q for v, q in zip(plan.inputs, q_in, strict=True) if _is_tensor(plan, v)],
            "output": [q for v, q in zip(plan.outputs, q_out, strict=True) if _is_tensor(plan, v)],
        }
        ios = []
        for kind, tensors in (("input", m.inputs), ("output", m.outputs)):
            for i, t in enumerate(tensors):
                q = quants[kind][i] if i < len(quants[kind]) else None
                if q is not None and not math.isfinite(q.scale):
                    raise EtforgeError(f"{program.path}: {kind} {i} of {m.name!r} has scale {q.scale}")
                ios.append(
                    {
                        "kind": kind,
                        "index": i,
                        "dtype": t.dtype,
                        "sizes": list(t.sizes),
                        "dim_order": list(t.dim_order),
                        "quant": None
                        if q is None
                        else {
                            "scale": q.scale,
                            "zero_point": q.zero_point,
                            "scale_literal": _float_literal(q.scale),
                        },
                    }
                )
        methods.append(
            {
                "name": m.name,
                "ident": escape.ident_from(m.name),
                "arenas": m.arena_bytes,
                "inputs": [x for x in ios if x["kind"] == "input"],
                "outputs": [x for x in ios if x["kind"] == "output"],
            }
        )
    return methods


def _is_tensor(plan: Any, index: int) -> bool:
    return type(plan.values[index].val).__name__ == "Tensor"


def _npu_memory(program: ProgramInfo, report: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Each NPU delegate's working memory, in program order: planned from its host-only payload;
    a device payload's figure is the NPU compiler's (report.json's entry of the same partition
    name, checked to be a byte count: ``verify`` cannot hold it to the program). Matched by
    name, never by position: the report lists partitions in tag order, the program its delegates
    in the order ExecuTorch emits them."""
    listed = (report or {}).get("memory", {}).get("npu_partitions", [])
    reported = {p.get("name"): (i, p) for i, p in enumerate(listed) if isinstance(p, dict)}
    out = []
    for k, (name, working) in enumerate(program_facts.npu_working(program.program)):
        if working is None:
            if name is None or name not in reported:
                raise EtforgeError(
                    f"report.json: memory.npu_partitions has no entry for delegate {k} "
                    f"({'partition ' + repr(name) if name else 'it names no partition'}) of {Path(program.path).name}"
                )
            i, rep = reported[name]
            working = rep.get("working_bytes")
            if not isinstance(working, int) or isinstance(working, bool) or working < 0:
                raise EtforgeError(
                    f"report.json: memory.npu_partitions[{i}].working_bytes {working!r} is not a byte count"
                )
        out.append({"name": name if name is not None else f"delegate {k}", "working_bytes": working})
    return out


def _neutron(out_dir: Path, report: dict[str, Any] | None, pte_dir: Path) -> tuple[list[dict[str, str]], str]:
    parts = (report or {}).get("partitions", [])
    if not parts:
        return [], "absent: the program has no NPU partitions"
    selections = []
    for p in parts:
        escape.c_identifier(p.get("name"), "report.json: partition name")  # also a file name here
        path = pte_dir / "partitions" / f"{p['name']}_kernel_selection.c"
        if p.get("kernel_selection") and path.is_file():
            selections.append({"name": p["name"], "code": path.read_text()})
    if selections:
        return selections, f"merged from {len(selections)} partition(s) by the eIQ Neutron SDK"
    status = (report or {}).get("npu_compiler", {}).get("status", "the NPU compiler produced none")
    return [], f"absent: no partition has SDK kernel selection code ({status})"


def generate(
    pte: Path,
    out_dir: Path,
    prefix: str = "",
    namespace: str = "etforge_model",
    report: dict[str, Any] | None = None,
    allow_missing: bool = False,
    check: bool = False,
    libraries: tuple[str, ...] | None = None,
) -> CodegenResult:
    """Render every file; write them (or, with ``check``, only compare with what is there)."""
    _check_names(namespace, prefix)
    if report is None and (pte.parent / "report.json").is_file():
        report = json.loads((pte.parent / "report.json").read_text())
    # empty, truncated, or not the program the report describes (its pte_sha256): refused
    check_pte(pte, report if report is not None and "pte_sha256" in report else None)
    program = read_program(pte)
    entries, missing = _kernel_entries(pte, program.operators, libraries, allow_missing)
    by_ns: dict[str, list[str]] = {}
    for e in entries:
        by_ns.setdefault(e.namespace, [])
        if e.declaration not in by_ns[e.namespace]:
            by_ns[e.namespace].append(e.declaration)
    base = prefix.rstrip("_") or "etforge_model"
    names = {
        "source": f"{base}_kernels.cpp",
        "header": f"{base}.h",
        "yaml": "selected_operators.yaml",
        "cmake": f"{base}.cmake",
        "neutron": f"{base}_neutron_kernels.c",
    }
    selections, neutron_status = _neutron(out_dir, report, pte.parent)
    delegates = read_delegates(program.program)
    host_only = [d.partition for d in delegates if d.host_only]
    if missing:
        neutron_status += f"; operators without a kernel library: {', '.join(missing)}"
    ctx = {
        "version": __version__,
        "program_name": pte.name,
        "prefix": prefix,
        "namespace": namespace,
        "libraries": sorted({e.library for e in entries}),
        "kernels": entries,
        "declarations": sorted(by_ns.items()),
        "header_name": names["header"],
        "register_source": names["source"],
        "pte_size": program.size,
        "pte_alignment": PTE_ALIGNMENT,
        "target": (report or {}).get("target", "unknown"),
        "cpu": (report or {}).get("cpu", "unknown"),
        "isa": (report or {}).get("isa") or "none",
        "scratch_bytes": sum(program_facts.scratch_bytes(plan) for plan in program.program.execution_plan),
        "methods": _io(program),
        "npu_memory": _npu_memory(program, report),
        "npu_source": (report or {}).get("memory", {}).get("npu_source", ""),
        "neutron_status": neutron_status,
        "neutron_selection": bool(selections),
        "delegates": delegates,
        "host_only_partitions": host_only,
        "fallback_arenas": program_facts.fallback_arenas(program.program),
        "operators": [e.op for e in entries],
        "parts": selections,
        "cmake_name": names["cmake"],
        "cmake_base": base,  # CMake names carry it: a firmware's own SOURCES is left alone
        "sources": [names["source"]] + ([names["neutron"]] if selections else []),
    }
    files = _render(ctx, names, bool(selections))
    changed = _write(out_dir, files, check)
    full = library_sizes()
    counts = Counter(e.library for e in entries)
    per_library = {lib: (counts.get(lib, 0), total) for lib, total in sorted(full.items())}
    return CodegenResult(files, [e.op for e in entries], missing, per_library, changed)


def _check_names(namespace: str, prefix: str) -> None:
    """The namespace and prefix end up in C and C++ identifiers and file names: refuse what
    would not compile (a keyword, a namespace the generated code uses, a non-ASCII letter)."""
    escape.cpp_namespace(namespace, "--namespace")
    escape.c_prefix(prefix, "--prefix")


def _kernel_entries(
    pte: Path, used: list[str], libraries: tuple[str, ...] | None, allow_missing: bool
) -> tuple[list[KernelEntry], list[str]]:
    """(a registration entry per used operator a kernel library provides, the operators none
    does); ``libraries`` narrows the catalogue, a missing kernel is an error unless allowed."""
    kernels = catalogue()
    if libraries is not None:
        unknown = sorted(set(libraries) - set(library_sizes()))
        if unknown:
            raise EtforgeError(
                f"unknown kernel libraries {', '.join(unknown)}; known: {', '.join(sorted(library_sizes()))}"
            )
        kernels = {op: k for op, k in kernels.items() if k.library in libraries}
    missing = [op for op in used if op not in kernels]
    if missing and not allow_missing:
        raise EtforgeError(
            f"{pte}: no known kernel library provides {', '.join(missing)} "
            "(`etforge codegen --allow-missing` generates the rest and lists them in the header; "
            "`etforge compile` refuses such programs)"
        )
    return [build_entry(kernels[op]) for op in used if op in kernels], missing


def _render(ctx: dict[str, Any], names: dict[str, str], neutron: bool) -> dict[str, bytes]:
    """Each file's bytes, by name (the Neutron kernel selection only when the SDK made one)."""
    env = _env()
    rendered = {
        names["source"]: env.get_template("register_kernels.cpp.j2").render(ctx),
        names["header"]: env.get_template("model.h.j2").render(ctx),
        names["yaml"]: env.get_template("selected_operators.yaml.j2").render(ctx),
        names["cmake"]: env.get_template("etforge.cmake.j2").render(ctx),
    }
    if neutron:
        rendered[names["neutron"]] = env.get_template("neutron_kernel_selection.c.j2").render(ctx)
    return {k: v.encode() for k, v in rendered.items()}


def _write(out_dir: Path, files: dict[str, bytes], check: bool) -> list[str]:
    """The files whose bytes differ from what ``out_dir`` holds; written unless ``check``
    (unchanged files are left alone: their timestamps do not trigger a firmware rebuild)."""
    changed = [
        n for n, data in files.items() if not (out_dir / n).is_file() or (out_dir / n).read_bytes() != data
    ]
    if not check:
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            if name in changed:
                (out_dir / name).write_bytes(data)
    return changed
