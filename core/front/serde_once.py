"""torch.export's and ExecuTorch's deserializers with the reflection they repeat asked once.

Both turn a program's JSON into schema dataclasses one value at a time, and for every value
ask Python again about its schema class: ``typing.get_type_hints`` (an ``eval`` of every
annotation) and ``dataclasses.fields`` (a filtered copy of the class's fields) — some 90,000
calls for MobileNetV2's three programs, on a few dozen classes. And every attribute read of a
schema union (``Argument``, ``SymInt``...) checks the field through two more attribute reads
(``self.type`` -> ``self._type``).

Inside :func:`reflection_once` both functions answer a schema class from a table filled by
their first call on it (a class's fields and annotations are fixed once it is defined), and a
union's read checks its tag directly (the same check). Nothing of torch's or ExecuTorch's code
is copied: the functions are theirs and Python's, called once per class; any other call passes
through. ``typing.get_origin`` and ``get_args``, called as often, are cheaper than a table.
Everything is restored on leaving; callers hold ``core.front.load``'s load lock around it (one
load patches at a time).
"""

from __future__ import annotations

import contextlib
import dataclasses
import typing
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType, ModuleType
from typing import Any

#: The schema modules whose classes' type hints are kept (their annotations are fixed).
_SCHEMA_MODULES = ("torch._export.serde", "executorch.exir.serde")


def _hints_once(original: Callable[..., Any]) -> Callable[..., Any]:
    """``typing.get_type_hints`` for the schema classes, each asked once per namespace; any
    other call passes through. What it returns is read-only (the deserializers only read it; a
    caller that edits it fails loudly instead of changing the next caller's answer)."""
    #: id(globalns) -> (globalns, kept: its id names no other namespace meanwhile; class -> hints)
    known: dict[int, tuple[Any, dict[type, Mapping[str, Any]]]] = {}

    def hints(obj: Any, globalns: Any = None, localns: Any = None, include_extras: bool = False) -> Any:
        if localns is not None or include_extras or not isinstance(obj, type):
            return original(obj, globalns, localns, include_extras)
        entry = known.get(id(globalns))
        try:
            hit = entry[1].get(obj) if entry is not None else None
        except TypeError:  # a class that cannot be a key (its metaclass): not a schema class
            hit = None
        if hit is not None:
            return hit
        if not obj.__module__.startswith(_SCHEMA_MODULES):
            return original(obj, globalns)
        hit = MappingProxyType(original(obj, globalns))
        known.setdefault(id(globalns), (globalns, {}))[1][obj] = hit
        return hit

    return hints


def _fields_once(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``dataclasses.fields`` of a schema class (or one of its objects: the same tuple), once."""
    known: dict[type, Any] = {}

    def fields(obj: Any) -> Any:
        cls = obj if isinstance(obj, type) else type(obj)
        try:
            hit = known.get(cls)
        except TypeError:  # a class that cannot be a key (its metaclass): not a schema class
            return original(obj)
        if hit is not None:
            return hit
        if not cls.__module__.startswith(_SCHEMA_MODULES):  # (no schema object has fields of its own)
            return original(obj)
        hit = known[cls] = original(cls)
        return hit

    return fields


def _direct_reads(union: ModuleType) -> Callable[[Any, str], Any]:
    """A schema union's attribute read as ``union._Union.__getattribute__`` makes it (an unset
    field of the union raises AttributeError), with its tag read directly instead of through
    the ``type`` property."""
    get = object.__getattribute__
    names = union._get_field_names

    def read(self: Any, name: str) -> Any:
        attr = get(self, name)
        if attr is None and name in names(type(self)) and name != get(self, "_type"):
            raise AttributeError(f"Field {name} is not set.")
        return attr

    return read


def _post_init_once(union: ModuleType) -> Callable[[Any], None]:
    """A schema union's ``__post_init__`` (no field may take a reserved name: a property of the
    class) run for the first object of each class, not for every one."""
    original = union._Union.__post_init__
    checked: set[type] = set()

    def post_init(self: Any) -> None:
        cls = type(self)
        if cls not in checked:
            original(self)
            checked.add(cls)

    return post_init


@contextlib.contextmanager
def reflection_once(*unions: ModuleType) -> Iterator[None]:
    """For the block: the reflection functions above answered once per class or annotation,
    and each of ``unions``' (a serde ``union`` module) ``_Union`` reads direct."""
    saved: list[tuple[Any, str, Any]] = [
        (typing, "get_type_hints", typing.get_type_hints),
        (dataclasses, "fields", dataclasses.fields),
    ]
    fields = _fields_once(dataclasses.fields)
    patched: list[tuple[Any, str, Any]] = [
        (typing, "get_type_hints", _hints_once(typing.get_type_hints)),
        (dataclasses, "fields", fields),
    ]
    for union in unions:  # ``from dataclasses import fields`` there: its own name
        saved += [
            (union, "fields", union.fields),
            (union._Union, "__getattribute__", union._Union.__getattribute__),
            (union._Union, "__post_init__", union._Union.__post_init__),
        ]
        patched += [
            (union, "fields", fields),
            (union._Union, "__getattribute__", _direct_reads(union)),
            (union._Union, "__post_init__", _post_init_once(union)),
        ]
    for owner, name, value in patched:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)
