"""The NPU backend: partition -> LiteRT flatbuffer -> NPU compiler hook -> delegate payload."""

from __future__ import annotations

import json
from typing import Any, final

from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export import ExportedProgram

from etforge.core import payload
from etforge.core.litert_convert import Converted, convert_program
from etforge.core.plugin_manager import registry

#: Per-process record of converted partitions, in lowering order; the pipeline drains it
#: to write ``partitions/*.tflite`` and the report (preprocess can return only bytes).
CONVERTED: list[tuple[str, Converted, payload.Blob]] = []


def _specs(compile_specs: list[CompileSpec]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for spec in compile_specs:
        out[spec.key] = spec.value.decode() if isinstance(spec.value, bytes) else spec.value
    return out


@final
class EtforgeNpuBackend(BackendDetails):
    """ExecuTorch ahead-of-time backend for etforge NPU partitions."""

    @staticmethod
    def preprocess(edge_program: ExportedProgram, compile_specs: list[CompileSpec]) -> PreprocessResult:
        specs = _specs(compile_specs)
        reg = registry()
        target = reg.target(specs["target"])
        options = json.loads(specs.get("options", "{}"))
        name = f"etforge_{len(CONVERTED)}"
        converted = convert_program(edge_program, target, reg.converters_for(target), name=name)
        blob_bytes = _compile(converted, target, options, name)
        blob = payload.unpack(blob_bytes)
        CONVERTED.append((name, converted, blob))
        return PreprocessResult(
            processed_bytes=blob_bytes,
            debug_handle_map={k: tuple(v) for k, v in converted.debug_map.items()},
        )


def _compile(converted: Converted, target: Any, options: dict[str, Any], name: str) -> bytes:
    """Run the target's NPU compiler when available; otherwise ship the LiteRT model host-only."""
    comp_name = target.npu.compiler if target.npu is not None else None
    compiler = registry().npu_compilers.get(comp_name) if comp_name else None
    if compiler is not None and compiler.available()[0]:
        result = compiler.compile(converted.tflite, target, options, name)
        return payload.pack(result.format, name, result.host_only, result.data)
    return payload.pack(payload.FORMAT_LITERT_HOST, name, True, converted.tflite)
