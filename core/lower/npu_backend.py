"""The NPU backend: partition -> LiteRT flatbuffer -> NPU compiler hook -> delegate payload."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, final

from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export import ExportedProgram

from etforge.core.common.errors import EtforgeError
from etforge.core.contracts.npu_compiler import NpuPayload, PartitionIo
from etforge.core.contracts.target import TargetSpec
from etforge.core.litert import payload
from etforge.core.litert.convert import Converted, convert_program
from etforge.core.registry.manager import Registry, registry


@dataclass
class Lowered:
    """One partition as the backend produced it."""

    name: str
    converted: Converted
    payload: NpuPayload
    processed: bytes


#: Compile-spec key naming the partition (its delegation tag): the report's per-node
#: ``partition`` and the partition files use the same name by construction, and the ``.pte``
#: keeps it with the delegate (how readers match a delegate to its report entry).
PARTITION_KEY = payload.PARTITION_SPEC


@dataclass
class Lowering:
    """One lowering's registry, options, target and the partitions its backend produced.

    ExecuTorch calls ``preprocess`` (a staticmethod) with a partition and its compile specs
    only, and keeps only the bytes it returns. A :func:`lowering` block makes this object the
    *current* lowering of the context (a :class:`~contextvars.ContextVar`), which is how
    ``preprocess`` finds the registry to convert with and the list to return its partitions
    through. Nothing of it rides in the compile specs, so nothing of it reaches the ``.pte``.
    """

    registry: Registry
    partitions: list[Lowered] = field(default_factory=list)
    #: Every option of the compile, the build-only ones (a timeout) included: the compile
    #: specs carry only those that determine the output.
    options: dict[str, Any] = field(default_factory=dict)
    #: The target the lowering was given: ``preprocess`` compiles for it, not for the
    #: registry's target of that name (the float check's variant runs no NPU compiler).
    target: TargetSpec | None = None

    def in_tag_order(self) -> list[Lowered]:
        """The partitions in the partitioner's (graph) order: ExecuTorch may preprocess them
        in another order."""

        def index(p: Lowered) -> tuple[int, str]:
            tail = p.name.rsplit("_", 1)[-1]
            return (int(tail) if tail.isdigit() else -1, p.name)

        return sorted(self.partitions, key=index)


#: The lowering open in this context (``None``: a script's partitioner, the process registry).
_CURRENT: ContextVar[Lowering | None] = ContextVar("etforge_lowering", default=None)


@contextmanager
def lowering(
    reg: Registry, options: dict[str, Any] | None = None, target: TargetSpec | None = None
) -> Iterator[Lowering]:
    """A lowering with ``reg``: partitions converted inside the block land in ``.partitions``.

    Blocks nest (the innermost is current) and each ends its own, error or not."""
    low = Lowering(reg, options=dict(options or {}), target=target)
    token = _CURRENT.set(low)
    try:
        yield low
    finally:
        _CURRENT.reset(token)


#: Conversions taken as given in this context, by partition name (``verify``: the compile's
#: hash-checked ``partitions/*.tflite``): ``preprocess`` uses one instead of converting again.
_GIVEN: ContextVar[dict[str, Converted] | None] = ContextVar("etforge_given_conversions", default=None)


@contextmanager
def given_conversions(given: dict[str, Converted]) -> Iterator[None]:
    """Partitions named in ``given`` are not converted inside the block: their conversion is
    the one given (a partition not named is converted as always)."""
    token = _GIVEN.set(given)
    try:
        yield
    finally:
        _GIVEN.reset(token)


def current_lowering() -> Lowering | None:
    """The lowering whose block is open here, if any."""
    return _CURRENT.get()


def _specs(compile_specs: list[CompileSpec]) -> dict[str, Any]:
    return {s.key: s.value.decode() if isinstance(s.value, bytes) else s.value for s in compile_specs}


@final
class EtforgeNpuBackend(BackendDetails):
    """ExecuTorch ahead-of-time backend for etforge NPU partitions."""

    @staticmethod
    def preprocess(edge_program: ExportedProgram, compile_specs: list[CompileSpec]) -> PreprocessResult:
        specs = _specs(compile_specs)
        low = _CURRENT.get()
        reg = low.registry if low is not None else registry()
        own = low.target if low is not None else None
        target = own if own is not None and own.name == specs["target"] else reg.target(specs["target"])
        options = {**json.loads(specs.get("options", "{}")), **(low.options if low is not None else {})}
        name = str(specs.get(PARTITION_KEY, "etforge_0"))
        converted = (_GIVEN.get() or {}).get(name) or convert_program(
            edge_program, target, reg.converters_for(target), name=name, reg=reg
        )
        io = PartitionIo(tuple(converted.input_dim_orders), tuple(converted.output_dim_orders))
        result = compile_partition(converted.tflite, target, options, name, reg=reg, io=io)
        # A device payload goes in as the device runtime reads it; a host-only LiteRT model
        # is wrapped in etforge's tagged container so nothing mistakes it for microcode.
        processed = (
            result.data
            if result.runtime_backend_id
            else payload.pack(
                result.format,
                name,
                True,
                result.data,
                input_dim_orders=[list(d) for d in converted.input_dim_orders],
                output_dim_orders=[list(d) for d in converted.output_dim_orders],
            )
        )
        if low is not None:
            low.partitions.append(Lowered(name, converted, result, processed))
        return PreprocessResult(
            processed_bytes=processed,
            debug_handle_map={k: tuple(v) for k, v in converted.debug_map.items()},
        )


def compile_partition(
    tflite: bytes,
    target: TargetSpec,
    options: dict[str, Any],
    name: str,
    reg: Registry | None = None,
    io: PartitionIo | None = None,
) -> NpuPayload:
    """Run the target's NPU compiler when available; otherwise ship the LiteRT model host-only."""
    comp_name = target.npu.compiler if target.npu is not None else None
    compiler = (reg or registry()).npu_compilers.get(comp_name) if comp_name else None
    if compiler is not None and compiler.available()[0]:
        try:
            return compiler.compile_io(tflite, target, options, name, io or PartitionIo())
        except EtforgeError:
            raise
        except Exception as exc:
            raise EtforgeError(
                f"NPU compiler {compiler.name} failed on partition {name}: {type(exc).__name__}: {exc}"
            ) from exc
    return NpuPayload(payload.FORMAT_LITERT_HOST, tflite, host_only=True)
