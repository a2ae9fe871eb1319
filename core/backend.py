"""The NPU backend: partition -> LiteRT flatbuffer -> NPU compiler hook -> delegate payload."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, final

from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from executorch.exir.backend.compile_spec_schema import CompileSpec
from torch.export import ExportedProgram

from etforge.core import payload
from etforge.core.errors import EtforgeError
from etforge.core.litert_convert import Converted, convert_program
from etforge.core.npu_compiler import NpuPayload
from etforge.core.plugin_manager import registry
from etforge.core.target import TargetSpec


@dataclass
class Lowered:
    """One partition as the backend produced it."""

    name: str
    converted: Converted
    payload: NpuPayload
    processed: bytes


#: Per-process record of converted partitions in lowering order; the pipeline drains it to
#: write ``partitions/*.tflite`` and the report (``preprocess`` can return only bytes).
CONVERTED: list[Lowered] = []


def _specs(compile_specs: list[CompileSpec]) -> dict[str, Any]:
    return {s.key: s.value.decode() if isinstance(s.value, bytes) else s.value for s in compile_specs}


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
        result = compile_partition(converted.tflite, target, options, name)
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
        CONVERTED.append(Lowered(name, converted, result, processed))
        return PreprocessResult(
            processed_bytes=processed,
            debug_handle_map={k: tuple(v) for k, v in converted.debug_map.items()},
        )


def compile_partition(tflite: bytes, target: TargetSpec, options: dict[str, Any], name: str) -> NpuPayload:
    """Run the target's NPU compiler when available; otherwise ship the LiteRT model host-only."""
    comp_name = target.npu.compiler if target.npu is not None else None
    compiler = registry().npu_compilers.get(comp_name) if comp_name else None
    if compiler is not None and compiler.available()[0]:
        try:
            return compiler.compile(tflite, target, options, name)
        except EtforgeError:
            raise
        except Exception as exc:
            raise EtforgeError(
                f"NPU compiler {compiler.name} failed on partition {name}: {type(exc).__name__}: {exc}"
            ) from exc
    return NpuPayload(payload.FORMAT_LITERT_HOST, tflite, host_only=True)
