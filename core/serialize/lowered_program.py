"""The lowered Edge program (what ``model.pte`` was emitted from) saved beside it for ``verify``.

``verify`` runs the lowered program on the host; lowering ``quantized.pt2`` again costs it
1-3 s (partitioning, ``to_edge``'s decompositions, the CPU backend's passes). The compile
already has that program, so it saves it (``lowered_edge.exir``: ExecuTorch's own serializer,
``executorch.exir.serde``, which keeps ``executorch_call_delegate`` and each delegate's
``LoweredBackendModule``) and ``report.json`` records its sha256 like every side file; verify
loads it instead of lowering (``verify --rebuild`` lowers again and requires the same program).

Not a program a user runs: ``torch.export.load`` does not read it (the ``.exir`` suffix says so).
Two things ExecuTorch's serializer does not give: byte-identical files (``zipfile`` stamps the
time) and etforge's own node annotations (the partitioner's converter choice, constant and
code-moving marks, the quantized program's node a node came from), which verify's checks read.
So the archive is written with fixed timestamps, and the annotations travel in it as JSON.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.export import ExportedProgram

from etforge.core.common.errors import EtforgeError
from etforge.core.graph.utils import CONSTANT_KEY, MOVED_CODES_KEY
from etforge.core.litert.context import DECIDED_KEY

#: The archive's members as ``executorch.exir.serde.serialize.save`` names them, plus ours.
_PROGRAM, _STATE, _CONSTANTS, _EXAMPLES, _VERSION = (
    "serialized_exported_program.json",
    "serialized_state_dict.pt",
    "serialized_constants.pt",
    "serialized_example_inputs.pt",
    "version",
)
_ANNOTATIONS = "etforge_annotations.json"
#: The annotations' layout; a file of another layout is refused (recompile), never half-read.
FORMAT = 1
#: Node meta the serializer drops and verify reads; copied as JSON (tuples come back as tuples).
_KEPT = (DECIDED_KEY, CONSTANT_KEY, MOVED_CODES_KEY, "delegation_tag", "debug_handle")
#: ``from_node``: only its last source's name is kept — the node of the program before (the
#: serializer would write the whole chain with ``id()``s of graphs: other bytes on every run).
_SOURCE = "from_node"
#: How a call passed its arguments (positional count, keyword names): the serializer passes
#: an operator's non-tensor arguments by keyword, and verify's checks read ``node.args``.
_FORM = "etforge_call_form"
_EPOCH = (1980, 1, 1, 0, 0, 0)


def _schema(node: torch.fx.Node) -> Any:
    return getattr(node.target, "_schema", None)


def _reform(node: torch.fx.Node, positional: int, keywords: list[str]) -> bool:
    """``node``'s arguments passed as the compile passed them (values unchanged); whether they changed."""
    schema = _schema(node)
    names = [a.name for a in schema.arguments]
    values = {**dict(zip(names, node.args, strict=False)), **node.kwargs}
    default = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}

    def value(name: str) -> Any:
        if name in values:
            return values[name]
        if name in default:  # left out as its default
            return default[name]
        raise EtforgeError(f"node {node.name}: argument {name} missing from the saved program")

    args, kwargs = tuple(value(n) for n in names[:positional]), {k: value(k) for k in keywords}
    if args == node.args and kwargs == node.kwargs:
        return False
    node.args, node.kwargs = args, kwargs
    return True


def _graphs(gm: torch.fx.GraphModule, prefix: str = "") -> Iterator[tuple[str, torch.fx.GraphModule]]:
    """The program's graph and each delegate's original Edge program, by a path of attribute names."""
    yield prefix, gm
    for node in gm.graph.nodes:
        if node.op == "get_attr":
            original = getattr(getattr(gm, str(node.target), None), "original_module", None)
            if original is not None:
                yield from _graphs(original.graph_module, f"{prefix}{node.target}/")


def _jsonable(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    return isinstance(value, (tuple, list)) and all(_jsonable(v) for v in value)


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def annotations(ep: ExportedProgram) -> dict[str, dict[str, Any]]:
    """graph path -> {"order": node names in graph order, "nodes": node name -> its kept meta}."""
    out: dict[str, dict[str, Any]] = {}
    for path, gm in _graphs(ep.graph_module):
        nodes: dict[str, dict[str, Any]] = {}
        for node in gm.graph.nodes:
            kept = {k: node.meta[k] for k in _KEPT if k in node.meta and _jsonable(node.meta[k])}
            sources = node.meta.get(_SOURCE)
            if sources:
                kept[_SOURCE] = sources[-1].name
            if node.op == "call_function" and _schema(node) is not None:
                kept[_FORM] = [len(node.args), list(node.kwargs)]
            elif node.op == "output" and node.args and isinstance(node.args[0], list):
                kept[_FORM] = "list"  # the serializer gives a tuple
            if kept:
                nodes[node.name] = kept
        out[path] = {"order": [n.name for n in gm.graph.nodes], "nodes": nodes}
    return out


def _reorder(gm: torch.fx.GraphModule, order: list[str], path: Path) -> bool:
    """The graph's nodes as the compile had them: the deserializer adds a ``getitem`` for each
    unused output of a multi-output op, right after it; those (unused, not in ``order``) go,
    and the rest take ``order``'s places."""
    known = set(order)
    changed = False
    for node in reversed(list(gm.graph.nodes)):
        if node.name not in known and not node.users and node.op == "call_function":
            gm.graph.erase_node(node)
            changed = True
    by_name = {n.name: n for n in gm.graph.nodes}
    if set(by_name) != known:
        raise EtforgeError(f"{path}: its graph does not hold the nodes it lists; recompile")
    prev = None
    for name in order:
        node = by_name[name]
        if prev is not None and prev.next is not node:
            prev.append(node)
            changed = True
        prev = node
    return changed


def _annotate(ep: ExportedProgram, saved: dict[str, dict[str, Any]], path: Path) -> None:
    from torch.fx.traceback import NodeSource

    for where, gm in _graphs(ep.graph_module):
        if where not in saved:
            raise EtforgeError(f"{path}: no annotations for graph {where or '(top)'}; recompile")
        changed = _reorder(gm, saved[where]["order"], path)
        nodes = saved[where]["nodes"]
        for node in gm.graph.nodes:
            for key, value in nodes.get(node.name, {}).items():
                if key == _FORM and value == "list":
                    node.args = (list(node.args[0]), *node.args[1:])
                    changed = True
                elif key == _FORM:
                    changed = _reform(node, int(value[0]), [str(k) for k in value[1]]) or changed
                elif key == _SOURCE:
                    source = NodeSource(None)
                    source.node_info = NodeSource.NodeInfo(str(value), "", -1)
                    node.meta[_SOURCE] = [source]
                else:
                    node.meta[key] = _tuples(value)
        if changed:  # the module's code as the graph now reads
            gm.recompile()


def to_bytes(ep: ExportedProgram) -> bytes:
    """The archive: the same program gives the same bytes (fixed timestamps, fixed order)."""
    from executorch.exir.serde.serialize import SCHEMA_VERSION, serialize

    kept = annotations(ep)
    sources = [
        (n, n.meta.pop(_SOURCE))
        for _, gm in _graphs(ep.graph_module)
        for n in gm.graph.nodes
        if _SOURCE in n.meta
    ]
    try:
        artifact = serialize(ep)
    finally:
        for node, source in sources:
            node.meta[_SOURCE] = source
    members = [
        (_PROGRAM, artifact.exported_program),
        (_STATE, artifact.state_dict),
        (_CONSTANTS, artifact.constants),
        (_EXAMPLES, artifact.example_inputs),
        (_VERSION, ".".join(map(str, SCHEMA_VERSION)).encode()),
        (_ANNOTATIONS, json.dumps({"format": FORMAT, "graphs": kept}, sort_keys=True).encode()),
    ]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as archive:
        for name, data in members:
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            archive.writestr(info, bytes(data))
    return buf.getvalue()


def save_lowered(ep: ExportedProgram, path: Path) -> None:
    """Write ``ep`` to ``path`` (Python's ``open``: a full disk is an OSError naming the file)."""
    data = to_bytes(ep)
    with open(path, "wb") as f:
        f.write(data)


class UnreadableProgram(EtforgeError):
    """ExecuTorch's deserializer refused a saved program whose archive and version are in order:
    a program its serializer writes but cannot read back (a constant among the outputs), or one
    damaged with its hash forged. ``verify`` lowers ``quantized.pt2`` again then, and says so."""


def load_lowered(path: Path) -> ExportedProgram:
    """The program :func:`save_lowered` wrote, with its annotations; unpickling restricted to
    tensors (as ``core.front.load.load_program``). The CPU library's operators must be
    registered with torch first (an unknown operator would load as a stand-in that cannot run).
    A file that is not such an archive is named in one line."""
    from executorch.exir.serde import union
    from executorch.exir.serde.export_serialize import SerializedArtifact
    from executorch.exir.serde.serialize import SCHEMA_VERSION, deserialize
    from torch._export.serde import union as torch_union

    from etforge.core.front.load import (
        _Refused,
        _tensors_only,
        _unpickle_detail,
        check_archive,
        lazy_graph_modules,
    )
    from etforge.core.front.serde_once import reflection_once

    path = Path(path)
    check_archive(path)
    try:
        with zipfile.ZipFile(path) as archive:
            read = {name: archive.read(name) for name in (_PROGRAM, _STATE, _CONSTANTS, _EXAMPLES, _VERSION)}
            saved = json.loads(archive.read(_ANNOTATIONS))
        if not isinstance(saved, dict) or saved.get("format") != FORMAT:
            raise ValueError(f"annotations of another layout than {FORMAT}")
    except (zipfile.BadZipFile, KeyError, OSError, ValueError) as exc:
        raise EtforgeError(f"{path}: not a lowered program etforge saved ({exc}); recompile") from None
    if read[_VERSION].decode(errors="replace").split(".")[0] != str(SCHEMA_VERSION[0]):
        raise EtforgeError(f"{path}: saved with another ExecuTorch serializer version; recompile")
    try:
        with _tensors_only(), reflection_once(union, torch_union), lazy_graph_modules():
            ep = deserialize(
                SerializedArtifact(read[_PROGRAM], read[_STATE], read[_CONSTANTS], read[_EXAMPLES])
            )
    except _Refused as exc:
        raise EtforgeError(
            f"{path}: refused: holds pickled data other than tensors ({_unpickle_detail(str(exc))}); "
            "etforge never unpickles code from files"
        ) from None
    except Exception as exc:  # the serializer's limit, or a damaged program: named, not a traceback
        raise UnreadableProgram(f"{path}: cannot be read ({type(exc).__name__}: {exc}); recompile") from None
    try:
        _annotate(ep, saved["graphs"], path)
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise EtforgeError(f"{path}: its annotations do not fit its program ({exc!r}); recompile") from None
    return ep
