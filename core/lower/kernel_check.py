"""Every op left on the CPU needs a kernel the firmware can link — checked before anything is written.

A ``.pte`` names its CPU operators; the device registers kernels for them from the libraries
the target's CPU backend declares it links (``CpuBackend.kernel_libraries``: each names the
yaml file ExecuTorch ships that lists its operators, which this check reads). An operator no library
provides would load on the device and fail there, so ``compile`` refuses it — after first
trying to decompose the op (torch's decomposition table, applied to the float program before
quantization, so the parts are quantized like any other op) into operators that are provided.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from typing import TYPE_CHECKING, Any

import torch
from torch.export import ExportedProgram

from etforge.core.common import fallbacks
from etforge.core.common.errors import EtforgeError, PluginError
from etforge.core.contracts.cpu_backend import CpuBackend, KernelLibrary

if TYPE_CHECKING:
    from executorch.exir.schema import Program

#: Operators the ExecuTorch runtime executes itself (prim ops), without a kernel library.
RUNTIME_NAMESPACES: tuple[str, ...] = ("executorch_prim",)
RUNTIME_OPS: frozenset[str] = frozenset({"aten::sym_size.int", "aten::sym_numel", "aten::sym_stride.int"})

#: Rounds of decomposition before giving up (a decomposition may expose another missing op).
MAX_ROUNDS = 4


@dataclass(frozen=True)
class Missing:
    """A CPU node whose operator no linked library provides."""

    node: str
    #: The operator the program would register, ``ns::name.overload`` (the out variant), or
    #: the functional op's name when it has no out variant.
    op: str
    #: The ATen/custom op the node calls (what a decomposition replaces).
    aten: Any
    has_out_variant: bool
    #: The ATen op ``to_edge`` decomposed into this node, when not the node's own op (an
    #: LSTM's linear): decomposing that one before quantization quantizes its parts.
    origin: Any = None
    #: The name of the node it came from in the program given to ``to_edge`` (torch.fx
    #: provenance), which names the same node of the float program.
    source: str | None = None


def libraries_for(cpu_backend: CpuBackend) -> tuple[KernelLibrary, ...]:
    """The kernel libraries, in lookup order, a CPU backend's firmware links (it declares them)."""
    if not cpu_backend.kernel_libraries:
        raise PluginError(
            f"CPU backend {cpu_backend.name!r} declares no kernel_libraries: no CPU op would have a kernel"
        )
    return tuple(cpu_backend.kernel_libraries)


@cache
def library_operators(yaml_path: str) -> frozenset[str]:
    """Operators (``ns::name.overload``) with a kernel in one ExecuTorch kernel yaml (a path
    relative to the installed ``executorch`` package; libyaml when PyYAML has it)."""
    import importlib.util
    from pathlib import Path

    import yaml

    spec = importlib.util.find_spec("executorch")
    assert spec is not None and spec.submodule_search_locations
    path = Path(list(spec.submodule_search_locations)[0]) / yaml_path
    if not path.is_file():
        return frozenset()
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    ops: set[str] = set()
    for entry in yaml.load(path.read_text(), Loader=loader) or []:  # noqa: S506 (a safe loader)
        name = (entry.get("func") or "").split("(")[0] or entry.get("op")
        if name and any(k.get("kernel_name") for k in entry.get("kernels") or []):
            ops.add(name if "::" in name else f"aten::{name}")
    return frozenset(ops)


def provided(libraries: Sequence[KernelLibrary]) -> set[str]:
    """Operators (``ns::name.overload``) the libraries provide."""
    return set().union(*(library_operators(lib.yaml) for lib in libraries))


def _titles(libraries: Sequence[KernelLibrary]) -> str:
    return ", ".join(lib.title for lib in libraries)


def _overload(target: Any) -> torch._ops.OpOverload | None:
    """The OpOverload a call_function target runs (an Edge op wraps one), or None."""
    if isinstance(target, torch._ops.OpOverload):
        return target
    inner = getattr(target, "_op", None)
    return inner if isinstance(inner, torch._ops.OpOverload) else None


def _qualified(op: torch._ops.OpOverload) -> str:
    name = op._schema.name
    return f"{name}.{op._overloadname}" if op._overloadname else name


def registered_name(op: torch._ops.OpOverload) -> tuple[str, bool]:
    """The operator name the ``.pte`` registers for ``op`` (its out variant) and whether one exists."""
    import executorch.kernels.quantized  # noqa: F401  (registers quantized_decomposed out variants)
    from executorch.exir.dialects.edge.op.api import to_variant
    from executorch.exir.operator.convert import to_out_variant
    from torchgen.model import SchemaKind

    if any(a.is_out for a in op._schema.arguments):
        return _qualified(op), True
    try:
        out, _ = to_out_variant(op)
    except Exception:
        # to_out_variant groups every schema of the name and refuses a name with two of one
        # signature (aten::pow's int overloads): to_executorch finds an Edge op's out variant
        # by to_variant, and so does this.
        try:
            out = to_variant(op, SchemaKind.out)
        except Exception:  # no out variant registered (a custom op without one)
            return _qualified(op), False
    return _qualified(out), True


def library_of(target: Any, libraries: Sequence[KernelLibrary]) -> str | None:
    """The title of the first library in ``libraries`` with a kernel for the call_function
    ``target`` (the report's ``kernel``), or None (a runtime op, or none provides it)."""
    op = _overload(target)
    if op is None:
        return None
    name, has_out = registered_name(op)
    for lib in libraries:
        have = library_operators(lib.yaml)
        if (has_out and name in have) or (not has_out and name.removesuffix(".default") in have):
            return lib.title
    return None


def _is_runtime_op(name: str) -> bool:
    return name in RUNTIME_OPS or name.split("::")[0] in RUNTIME_NAMESPACES


def missing_kernels(program: ExportedProgram, libraries: Sequence[KernelLibrary]) -> list[Missing]:
    """CPU nodes of a lowered Edge program whose operator no library in ``libraries`` provides.

    Delegate calls, getitems and memory-planning nodes are not operators and are skipped.
    """
    have = provided(libraries)
    out: list[Missing] = []
    for node in program.graph_module.graph.nodes:
        if node.op != "call_function":
            continue
        op = _overload(node.target)
        if op is None:  # delegate calls, operator.getitem, exir.memory.alloc ...
            continue
        name, has_out = registered_name(op)
        if _is_runtime_op(name) or (has_out and name in have):
            continue
        if not has_out and name.removesuffix(".default") in have:
            continue  # a library registers the op itself (portable's aten::copy_: buffer write-back)
        origin = node.meta.get("original_aten")
        origin = origin if isinstance(origin, torch._ops.OpOverload) and origin != op else None
        chain = node.meta.get("from_node") or []
        source = getattr(chain[-1], "name", None) if chain else None
        out.append(Missing(node.name, name, op, has_out, origin, source))
    return out


def missing_in_pte(pte: bytes | Program, libraries: Sequence[KernelLibrary]) -> list[str]:
    """Operators of a serialized program (or its deserialized ``Program``) that no library
    provides (after ``to_executorch``)."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    have = provided(libraries)
    program = deserialize_pte_binary(pte).program if isinstance(pte, bytes) else pte
    names = {
        f"{o.name}.{o.overload}" if o.overload else o.name
        for plan in program.execution_plan
        for o in plan.operators
    }
    return sorted(n for n in names if n not in have and not _is_runtime_op(n))


def decompositions(missing: Sequence[Missing], program: ExportedProgram) -> dict[Any, Callable[..., Any]]:
    """torch's decompositions of the ops ``program`` calls that became the missing nodes.

    The float program's op the missing node came from comes first (an LSTM rather than the
    float linear ``to_edge`` decomposed it into), then the missing op itself.
    """
    decomposition_table = torch.export.default_decompositions()  # core ATen + composite ops
    calls = {n.name: n.target for n in program.graph_module.graph.nodes if n.op == "call_function"}
    present = set(calls.values())
    table: dict[Any, Callable[..., Any]] = {}
    for m in missing:
        candidates = (calls.get(m.source or ""), m.origin, m.aten)
        op = next(
            (c for c in candidates if c is not None and c in present and c in decomposition_table),
            None,
        )
        if op is not None:
            table[op] = decomposition_table[op]
    return table


def decompose(program: ExportedProgram, table: dict[Any, Callable[..., Any]]) -> ExportedProgram:
    """``program`` with exactly the ops in ``table`` decomposed (every other op kept as is)."""
    out = program.run_decompositions(table)
    if not out.example_inputs and program.example_inputs:
        out.example_inputs = program.example_inputs
    return out


def error(
    missing: Sequence[Missing], libraries: Sequence[KernelLibrary], target: str, decomposed: Sequence[str]
) -> EtforgeError:
    """One line naming each node, its op, the libraries tried and why decomposition did not help."""
    tried = _titles(libraries)
    by_op: dict[str, list[str]] = {}
    for m in missing:
        by_op.setdefault(m.op if m.has_out_variant else f"{m.op} (no out variant)", []).append(m.node)
    parts = [
        f"{op} at node {', '.join(nodes[:3])}{' ...' if len(nodes) > 3 else ''}"
        for op, nodes in by_op.items()
    ]
    after = f" after decomposing {', '.join(decomposed)}" if decomposed else ""
    return EtforgeError(
        f"{target}: no kernel for {'; '.join(parts)} in the libraries tried ({tried}){after}, and torch "
        "has no decomposition of it into operators they provide; nothing written (replace the op in "
        "the model, or add a CPU backend plugin whose kernel library provides it)"
    )


def next_decomposition(
    missing: Sequence[Missing],
    float_program: ExportedProgram,
    decomposed: Sequence[str],
    libraries: Sequence[KernelLibrary],
    target: str,
) -> dict[Any, Callable[..., Any]]:
    """The decompositions the next build round applies to the float program for ``missing``
    (ops already decomposed are not tried again); each one is a recorded fallback.

    Raises :class:`EtforgeError` when no decomposition is left to try. The loop that quantizes
    and lowers again is the compile session's (``core.build.session``)."""
    table = {op: fn for op, fn in decompositions(missing, float_program).items() if str(op) not in decomposed}
    if not table:
        raise error(missing, libraries, target, decomposed)
    for op in table:
        fallbacks.record(
            "kernels",
            "decomposed into operators that have kernels",
            str(op),
            f"no kernel library of {target} provides it",
        )
    return table


def check_pte(pte: bytes | Program, libraries: Sequence[KernelLibrary], target: str) -> None:
    """The serialized program's operator table against the libraries (what the device registers)."""
    missing = missing_in_pte(pte, libraries)
    if missing:
        tried = _titles(libraries)
        raise EtforgeError(
            f"{target}: the serialized program uses {', '.join(missing)}, which no kernel library "
            f"tried ({tried}) provides; nothing written"
        )
