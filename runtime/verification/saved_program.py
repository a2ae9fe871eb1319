"""The lowered program ``verify`` runs, as the compile saved it (``lowered_edge.exir``).

The compile writes the Edge program it emitted ``model.pte`` from (``core.serialize.lowered_program``)
and records its sha256 in ``report.json`` (checked first, ``artifact.check_hashes``). Loading it
replaces lowering ``quantized.pt2`` again (1-3 s). What it computes is still judged as before:
``model.pte`` against it (the ``.pte`` = Edge gate: every sample, every value), each op against
the references built from ``quantized.pt2`` (the NPU-op and CPU-op gates), the whole output
against the device simulation; its delegate payloads must be ``model.pte``'s byte for byte and,
where a payload carries its LiteRT model, that model ``partitions/NAME.tflite``.
``verify --rebuild`` lowers ``quantized.pt2`` again and requires the saved program to be that
program (:func:`same_program`): payloads, and node by node the ops, their arguments and constants.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.export import ExportedProgram

from etforge.core.build import output
from etforge.core.common.errors import EtforgeError
from etforge.core.litert import payload
from etforge.core.litert.convert import Converted
from etforge.runtime.verification.saved_partitions import conversions

#: ``--json``'s ``lowered_source``: which program verify ran.
SAVED = "saved"
LOWERED_AGAIN = "lowered again"


@dataclass
class SavedPartition:
    """One NPU partition of the saved program: what verify needs of a lowered ``Partition``."""

    name: str
    converted: Converted
    processed: bytes
    host_only: bool


def available(out: Path, report: dict[str, Any]) -> bool:
    """Whether ``out`` holds a saved lowered program the hash chain vouches for."""
    hashed = report.get(output.FILES_KEY) or {}
    return output.LOWERED_PROGRAM in hashed and (out / output.LOWERED_PROGRAM).is_file()


def delegates(ep: ExportedProgram) -> list[Any]:
    """The program's lowered backend modules, in graph order."""
    gm = ep.graph_module
    found = []
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            mod = getattr(gm, str(node.target), None)
            if getattr(mod, "processed_bytes", None) is not None:
                found.append(mod)
    return found


def partition_of(mod: Any) -> str:
    """The partition a delegate was lowered for: the name the partitioner gave it in the
    delegate's compile specs (device code names none itself)."""
    specs = {c.key: bytes(c.value) for c in getattr(mod, "compile_specs", None) or []}
    return specs.get(payload.PARTITION_SPEC, b"").decode(errors="replace")


def load(out: Path, report: dict[str, Any]) -> tuple[ExportedProgram, list[SavedPartition]]:
    """The saved program and its partitions, each paired with its hash-checked
    ``partitions/NAME.tflite`` (raises naming what does not match)."""
    from etforge.core.serialize.lowered_program import load_lowered
    from etforge.runtime.execution.cpu_libraries import host_libraries

    host_libraries()  # the CPU libraries' operators (cortex_m::) registered before the load
    path = out / output.LOWERED_PROGRAM
    ep = load_lowered(path)
    given = conversions(out, report)
    names = [str(e.get("name")) for e in report.get("partitions") or []]
    mods = delegates(ep)
    if len(mods) != len(names):
        raise EtforgeError(
            f"{path}: holds {len(mods)} delegate(s), {output.REPORT} records {len(names)} partition(s); recompile {out}"
        )
    by_name: dict[str, Any] = {}
    for mod in mods:
        name = partition_of(mod)
        if name not in names or name in by_name:
            raise EtforgeError(
                f"{path}: a delegate for partition {name!r}, which {output.REPORT} records "
                f"{'twice' if name in by_name else 'nowhere'}; recompile {out}"
            )
        by_name[name] = mod
    parts = []
    for name in names:  # report.json's order; the graph's may differ (a recurrent model's)
        mod = by_name[name]
        processed = bytes(mod.processed_bytes)
        file = out / output.PARTITIONS / f"{name}.tflite"
        if name not in given:
            raise EtforgeError(f"{file}: missing or not hash-checked in {output.REPORT}; recompile {out}")
        host_only = processed.startswith(payload.MAGIC)
        if host_only:
            blob = payload.unpack(processed)
            if blob.partition != name or blob.data != given[name].tflite:
                raise EtforgeError(
                    f"{file}: does not match partition {blob.partition}'s model in {path.name}; recompile {out}"
                )
        parts.append(SavedPartition(name, given[name], processed, host_only))
    return ep, parts


def _node_ops(ep: ExportedProgram) -> list[tuple[str, str, str, str]]:
    return [(n.op, n.name, str(n.target), f"{n.args!r} {n.kwargs!r}") for n in ep.graph_module.graph.nodes]


def _tensors(ep: ExportedProgram) -> dict[str, torch.Tensor]:
    return {**ep.state_dict, **{k: v for k, v in ep.constants.items() if isinstance(v, torch.Tensor)}}


def same_program(saved: ExportedProgram, lowered: ExportedProgram, where: str = "") -> str | None:
    """None if ``saved`` is ``lowered``: node by node the same ops, names and arguments, the
    same constants bit for bit, and the same delegates (payloads, except NPU device code against
    a host-only payload where the NPU compiler is missing here; their Edge programs alike);
    else the first difference, in words."""
    a, b = _node_ops(saved), _node_ops(lowered)
    for x, y in zip(a, b, strict=False):
        if x != y:
            return f"{where}node {x[1]} ({x[2]}) where the lowering has {y[1]} ({y[2]})" + (
                f": arguments {x[3]} vs {y[3]}" if x[:3] == y[:3] else ""
            )
    if len(a) != len(b):
        return f"{where}{len(a)} nodes where the lowering has {len(b)}"
    ta, tb = _tensors(saved), _tensors(lowered)
    if sorted(ta) != sorted(tb):
        return f"{where}constants {sorted(set(ta) ^ set(tb))[:3]} differ"
    for name, t in ta.items():
        u = tb[name]
        if t.dtype != u.dtype or t.shape != u.shape or not torch.equal(t, u):
            return f"{where}constant {name} differs"
    da, db = delegates(saved), delegates(lowered)
    for i, (x, y) in enumerate(zip(da, db, strict=True)):
        px, py = bytes(x.processed_bytes), bytes(y.processed_bytes)
        # NPU device code saved by a compile that had the NPU compiler, a host-only payload
        # lowered here without it: not comparable byte for byte (the payload-bytes gate notes it)
        device_here_host = not px.startswith(payload.MAGIC) and py.startswith(payload.MAGIC)
        if px != py and not device_here_host:
            return f"{where}delegate {i}'s payload differs"
        why = same_program(x.original_module, y.original_module, f"{where}delegate {i}: ")
        if why is not None:
            return why
    return None
