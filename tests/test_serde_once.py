"""The loads' reflection shim (``core.front.serde_once``): a saved program loads through it as
through torch's and ExecuTorch's plain deserializers (every node, argument, tensor meta and
constant), each schema class is reflected on once per load, and on leaving every patched name
is torch's, ExecuTorch's and Python's own again, with the schema unions' checks intact."""

from __future__ import annotations

import dataclasses
import typing
import zipfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from support import REPO, run_cli

MIXED = f"{REPO / 'tests' / 'models' / 'saved_program_models.py'}:mixed"


@pytest.fixture(scope="module")
def npu_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A compile with an NPU delegate: ``lowered_edge.exir`` holds its Edge program too."""
    out = tmp_path_factory.mktemp("npu") / "out"
    proc = run_cli("compile", MIXED, "--target", "imxrt700cm", "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def _val(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), tuple(v.stride()), v.dtype, str(v.device), v.requires_grad)
    if isinstance(v, (list, tuple)):
        return tuple(_val(x) for x in v)
    return repr(v)


def _programs(ep: Any) -> Iterator[Any]:
    """The program and each delegate's Edge program in it (``original_module``), depth first."""
    yield ep
    gm = ep.graph_module
    for node in gm.graph.nodes:
        original = getattr(getattr(gm, str(node.target), None), "original_module", None)
        if node.op == "get_attr" and original is not None:
            yield from _programs(original)


def _fingerprint(ep: Any) -> list[Any]:
    """Everything a load builds that verify reads: nodes (names, ops, targets, arguments, every
    meta entry, tensor metas by shape, stride and dtype), signatures, constants bit for bit."""
    out: list[Any] = []
    for program in _programs(ep):
        out.append(repr(program.graph_signature))
        tensors = {**program.state_dict, **program.constants}
        for name in sorted(tensors):
            t = tensors[name]
            out.append((name, _val(t), t.detach().numpy().tobytes()))
        for node in program.graph_module.graph.nodes:
            meta = {k: _val(v) if k == "val" else repr(v) for k, v in node.meta.items()}
            out.append((node.op, node.name, str(node.target), repr(node.args), repr(node.kwargs), meta))
    return out


def _plain_lowered(path: Path) -> Any:
    """ExecuTorch's deserializer on ``lowered_edge.exir``, with nothing of etforge around it."""
    from executorch.exir.serde.export_serialize import SerializedArtifact
    from executorch.exir.serde.serialize import deserialize

    from etforge.core.serialize import lowered_program as lp

    with zipfile.ZipFile(path) as archive:
        read = [archive.read(n) for n in (lp._PROGRAM, lp._STATE, lp._CONSTANTS, lp._EXAMPLES)]
    return deserialize(SerializedArtifact(*read))


def test_the_programs_load_as_through_the_plain_deserializers(npu_out: Path) -> None:
    from executorch.exir.serde import union
    from torch._export.serde import union as torch_union

    from etforge.core.front.serde_once import reflection_once
    from etforge.runtime.execution.cpu_libraries import host_libraries

    host_libraries()  # the CPU library's ops, as verify registers them before the load
    for name in ("float.pt2", "quantized.pt2"):
        plain = torch.export.load(npu_out / name)
        with reflection_once(torch_union):
            shimmed = torch.export.load(npu_out / name)
        assert _fingerprint(shimmed) == _fingerprint(plain), name
        assert shimmed.graph_module.code == plain.graph_module.code
    path = npu_out / "lowered_edge.exir"
    plain = _plain_lowered(path)
    with reflection_once(union, torch_union):
        shimmed = _plain_lowered(path)
    assert len(list(_programs(plain))) == 2  # the program and its delegate's Edge program
    assert _fingerprint(shimmed) == _fingerprint(plain)


def test_each_schema_class_is_reflected_on_once_per_load(
    npu_out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's and ExecuTorch's deserializers ask ``get_type_hints`` and ``fields`` of the same
    schema classes once per value (thousands of times per program); the loads ask once."""
    from etforge.core.front.load import load_program
    from etforge.core.serialize.lowered_program import load_lowered
    from etforge.runtime.execution.cpu_libraries import host_libraries

    host_libraries()
    asked: Counter[tuple[str, Any]] = Counter()
    hints, fields = typing.get_type_hints, dataclasses.fields

    def counted_hints(obj: Any, *args: Any, **kwargs: Any) -> Any:
        asked["hints", obj, id(kwargs.get("globalns", args[0] if args else None))] += 1
        return hints(obj, *args, **kwargs)

    def counted_fields(obj: Any) -> Any:
        asked["fields", obj if isinstance(obj, type) else type(obj)] += 1
        return fields(obj)

    monkeypatch.setattr(typing, "get_type_hints", counted_hints)
    monkeypatch.setattr(dataclasses, "fields", counted_fields)
    for load in (
        lambda: load_program(npu_out / "quantized.pt2"),
        lambda: load_lowered(npu_out / "lowered_edge.exir"),
    ):
        asked.clear()
        load()
        schema = {k: n for k, n in asked.items() if "serde" in getattr(k[1], "__module__", "")}
        assert len(schema) > 10, asked  # the schema classes were reflected on ...
        assert max(schema.values()) == 1, Counter(schema).most_common(3)  # ... each once
    assert typing.get_type_hints is counted_hints and dataclasses.fields is counted_fields  # restored


def test_leaving_restores_every_name_and_the_unions_still_check() -> None:
    from torch._export.serde import schema, union

    from etforge.core.front.serde_once import reflection_once

    before = (
        typing.get_type_hints,
        dataclasses.fields,
        union.fields,
        union._Union.__dict__["__getattribute__"],
        union._Union.__dict__["__post_init__"],
    )
    with pytest.raises(RuntimeError, match="inside"), reflection_once(union):
        arg = schema.Argument.create(as_int=3)
        assert arg.as_int == 3 and arg.type == "as_int" and arg.value == 3
        with pytest.raises(AttributeError, match="as_float is not set"):
            _ = arg.as_float  # an unset field of a union, as torch refuses it

        @union._union_dataclass
        class Reserved(union._Union):
            value: int | None = None

        with pytest.raises(AssertionError, match="reserved"):
            Reserved.create(value=1)  # the reserved-name check still runs for a new class
        raise RuntimeError("inside")  # an error leaves the block restored too
    after = (
        typing.get_type_hints,
        dataclasses.fields,
        union.fields,
        union._Union.__dict__["__getattribute__"],
        union._Union.__dict__["__post_init__"],
    )
    assert after == before
