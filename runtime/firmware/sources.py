"""Where the firmware's sources come from, and which kernel sources a program needs.

ExecuTorch and CMSIS-NN are the user's (their MCU SDK has them): options or environment
variables name them, and nothing outside them is searched (docs/firmware.md, "Sources", says
where to get them; the tests point the variables at CI's pinned snapshots). The kernels a program needs are found the way
ExecuTorch's selective build finds them: each operator in ``selected_operators.yaml`` is
looked up in the kernel libraries' yaml (``kernel_name``), and the library source defining
that function is the one compiled.
"""

from __future__ import annotations

import os
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from etforge.core.common.errors import EtforgeError

ENV_EXECUTORCH = "ETFORGE_EXECUTORCH_SRC"
ENV_CMSIS_NN = "ETFORGE_CMSIS_NN_SRC"
ENV_FLATBUFFERS = "ETFORGE_FLATBUFFERS_INCLUDE"
ENV_SCHEMA = "ETFORGE_SCHEMA_INCLUDE"

#: Where to get each tree, for the error that asks for it (versions: docs/firmware.md).
_GET = {
    ENV_EXECUTORCH: "the pytorch/executorch source at v1.5.x, or your MCU SDK's copy",
    ENV_CMSIS_NN: "ARM-software/CMSIS-NN at dbf45dbfcc515421dd6099037d3e2637b90748c8, or your MCU SDK's CMSIS-NN",
}


def kernel_libraries() -> dict[str, tuple[str, str]]:
    """Kernel libraries the firmware compiles per kernel: name -> (operator yaml, source
    directory), relative to the ExecuTorch tree, as the CPU backend plugins declare them
    (``KernelLibrary.sources``; a library without a source directory is not compiled here)."""
    from etforge.core.registry.manager import registry

    return {
        lib.name: (lib.yaml, lib.sources)
        for backend in registry().cpu_backends.values()
        for lib in backend.kernel_libraries
        if lib.sources
    }


#: Operator namespaces the runtime registers itself (``kernels/prim_ops``, linked whole).
PRIM_NAMESPACES = ("executorch_prim::", "aten::sym_size", "aten::sym_numel")


@dataclass(frozen=True)
class Sources:
    executorch: Path
    cmsis_nn: Path
    flatbuffers: Path  #: directory holding ``flatbuffers/flatbuffers.h``
    schema: Path  #: directory holding ``executorch/schema/program_generated.h``


def _pick(option: str | Path | None, env: str, default: Path | None, what: str, probe: str) -> Path:
    chosen = option or os.environ.get(env) or default
    source = "option" if option else (f"${env}" if os.environ.get(env) else "default")
    if chosen is None:
        where = f" ({_GET[env]}; see docs/firmware.md, Sources)" if env in _GET else ""
        raise EtforgeError(f"no {what} given: set ${env} to its directory{where}")
    path = Path(chosen).expanduser().resolve()
    if not (path / probe).exists():
        raise EtforgeError(f"{what} at {path} ({source}): no {probe} there")
    return path


def locate(executorch_src: str | Path | None = None, cmsis_nn_src: str | Path | None = None) -> Sources:
    """The source trees to build from; a missing one is named with the option that sets it."""
    et = _pick(
        executorch_src, ENV_EXECUTORCH, None, "ExecuTorch source (--executorch-src)",
        "runtime/executor/method.cpp",
    )  # fmt: skip
    nn = _pick(
        cmsis_nn_src, ENV_CMSIS_NN, None, "CMSIS-NN source (--cmsis-nn-src)",
        "Include/arm_nnfunctions.h",
    )  # fmt: skip
    purelib = Path(sysconfig.get_paths()["purelib"]) / "include"
    fb_default = purelib if (purelib / "flatbuffers").is_dir() else Path("/usr/include")
    fb = _pick(None, ENV_FLATBUFFERS, fb_default, "FlatBuffers C++ headers", "flatbuffers/flatbuffers.h")
    schema_default = next(
        (p for p in (et.parent / "generated", et / "build" / "generated")
         if (p / "executorch/schema/program_generated.h").is_file()),
        None,
    )  # fmt: skip
    schema = _pick(
        None, ENV_SCHEMA, schema_default, "ExecuTorch's generated schema headers (flatc output)",
        "executorch/schema/program_generated.h",
    )  # fmt: skip
    return Sources(et, nn, fb, schema)


def selected_operators(yaml_path: Path) -> list[str]:
    """Operator names in a ``selected_operators.yaml`` (``operators:`` keys)."""
    import yaml

    if not yaml_path.is_file():
        raise EtforgeError(f"{yaml_path}: missing; run etforge codegen (or compile) for this program")
    data = yaml.safe_load(yaml_path.read_text()) or {}
    ops = data.get("operators")
    if not isinstance(ops, dict):
        raise EtforgeError(f"{yaml_path}: no operators mapping (not a selective-build yaml)")
    return sorted(ops)


def _kernel_names(et: Path, library: str) -> dict[str, str]:
    import yaml

    yaml_rel, _ = kernel_libraries()[library]
    entries = yaml.safe_load((et / yaml_rel).read_text()) or []
    names: dict[str, str] = {}
    for e in entries:
        func = e.get("func") or e.get("op")
        kernels = e.get("kernels") or []
        if not func or not kernels:
            continue
        op = func.split("(", 1)[0]
        if "::" not in op:
            op = f"aten::{op}"
        names[op] = kernels[0]["kernel_name"]
    return names


def kernel_sources(et: Path, operators: list[str]) -> list[str]:
    """ExecuTorch-relative sources defining the kernels of ``operators`` (cortex_m ops are in
    the prebuilt library and prim ops in the runtime, so neither is listed)."""
    libraries = kernel_libraries()
    tables = {lib: _kernel_names(et, lib) for lib in libraries}
    found: set[str] = set()
    for op in operators:
        if op.startswith(PRIM_NAMESPACES):
            continue
        lib = next((lib for lib, t in tables.items() if op in t), None)
        if lib is None:
            raise EtforgeError(
                f"operator {op}: no kernel for it in ExecuTorch's portable, quantized or cortex_m "
                f"libraries at {et}"
            )
        if lib == "cortex_m":
            continue
        function = tables[lib][op].rsplit("::", 1)[-1]
        found.add(_defining_source(et, libraries[lib][1], op, function))
    return sorted(found)


def _defining_source(et: Path, src_dir: str, op: str, function: str) -> str:
    base = op.split("::", 1)[-1].split(".", 1)[0]
    directory = et / src_dir
    candidates = [directory / f"op_{base}.cpp", *sorted(directory.glob("op_*.cpp"))]
    # a kernel's definition takes the runtime context first (any return type: Tensor&, tuple),
    # or a macro defines it (``DEFINE_UNARY_UFUNC_...(exp_out, std::exp)``)
    pattern = re.compile(
        rf"\b{re.escape(function)}\s*\(\s*(?:[\w:]+::)?(?:Kernel)?RuntimeContext\s*&"
        rf"|\bDEFINE_\w+\(\s*{re.escape(function)}\s*,"
    )
    for path in candidates:
        if path.is_file() and pattern.search(path.read_text(errors="replace")):
            return str(path.relative_to(et))
    raise EtforgeError(f"operator {op}: no source in {directory} defines {function}")


_PORTABLE_INCLUDE = re.compile(r'#include\s*[<"]executorch/(kernels/portable/cpu/[\w/]+)\.h[>"]')
_LOCAL_INCLUDE = re.compile(r'#include\s*"(\w+\.h)"')


def util_closure(et: Path, sources: list[str]) -> list[str]:
    """The portable utility sources (``kernels/portable/cpu/{util,pattern}``) that ``sources``
    need: each included utility header's ``.cpp``, followed through their own includes."""
    seen: set[str] = set()
    needed: set[str] = set()
    todo = list(sources)
    while todo:
        rel = todo.pop()
        path = et / rel
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        for local in _LOCAL_INCLUDE.findall(text):  # e.g. cortex_m_ops_common.h
            near = str(Path(rel).parent / local)
            if near not in seen and (et / near).is_file():
                seen.add(near)
                todo.append(near)
        for stem in _PORTABLE_INCLUDE.findall(text):
            if stem in seen:
                continue
            seen.add(stem)
            todo.append(f"{stem}.h")
            impls = [f"{stem}.cpp"]
            if stem.endswith("pattern/pattern"):  # declared there, defined one per file
                impls = [str(p.relative_to(et)) for p in sorted((et / stem).parent.glob("*.cpp"))]
            for impl in impls:
                if (et / impl).is_file() and impl not in needed:
                    needed.add(impl)
                    todo.append(impl)
    return sorted(needed)


def cortex_m_sources(et: Path) -> list[str]:
    return sorted(str(p.relative_to(et)) for p in (et / kernel_libraries()["cortex_m"][1]).glob("op_*.cpp"))


_NN_TYPES = re.compile(r"_(s4|s8|s16|s32|s64|f16|f32|q7|q15)(?=_|$)")


def cmsis_nn_sources(nn: Path) -> list[str]:
    """CMSIS-NN's int8 sources (relative to ``nn``): a file whose name mentions s8/q7, or no data
    type at all (tables, support); not the s4/s16/float kernels, LSTM or SVDF."""
    keep = []
    for path in sorted((nn / "Source").rglob("*.c")):
        rel = path.relative_to(nn)
        name = path.stem.lower()
        if "Bindings" in rel.parts or "lstm" in name or "svdf" in name:
            continue
        types = set(_NN_TYPES.findall(name))
        if not types or types & {"s8", "q7"}:  # q7 is CMSIS-NN's older name for int8
            keep.append(str(rel))
    return keep
