"""The compile pipeline's stages as plain functions: export, quantize, lower, serialize.

ExecuTorch does the heavy lifting (``to_edge_transform_and_lower`` decomposes once and
runs our partitioner and backend); these functions only wire plugins into it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from executorch.exir import EdgeCompileConfig, EdgeProgramManager, to_edge_transform_and_lower
from torch.export import ExportedProgram

from etforge.core import backend
from etforge.core.litert_convert import Converted
from etforge.core.npu_compiler import NpuPayload
from etforge.core.partitioner import EtforgePartitioner
from etforge.core.plugin_manager import Registry, registry
from etforge.core.quantize import ComposedQuantizer, convert, prepare
from etforge.core.target import TargetSpec


@dataclass
class Partition:
    """One NPU partition as lowered: its LiteRT model and the delegate payload."""

    name: str
    converted: Converted
    payload: NpuPayload
    processed: bytes

    @property
    def host_only(self) -> bool:
        return self.payload.host_only


def export(module: torch.nn.Module, example_inputs: tuple[Any, ...]) -> ExportedProgram:
    return torch.export.export(module.eval(), example_inputs, strict=False)


def quantizer_for(target: TargetSpec, reg: Registry | None = None, qat: bool = False) -> ComposedQuantizer:
    reg = reg or registry()
    return ComposedQuantizer(reg.rules_for(target), is_qat=qat)


def quantize(
    ep: ExportedProgram,
    target: TargetSpec,
    calibration: Iterable[Sequence[Any]],
    reg: Registry | None = None,
) -> ExportedProgram:
    """PT2E post-training quantization with the target's composed quantizer; re-exported."""
    example = ep.example_inputs[0] if ep.example_inputs else None
    gm = ep.module(check_guards=False)
    gm = prepare(gm, quantizer_for(target, reg))
    for batch in calibration:
        gm(*batch)
    gm = convert(gm)
    return torch.export.export(gm, tuple(example), strict=False)


def edge_config() -> EdgeCompileConfig:
    return EdgeCompileConfig(_check_ir_validity=False)


def lower(
    ep: ExportedProgram,
    target: TargetSpec,
    options: dict[str, Any] | None = None,
    reg: Registry | None = None,
) -> tuple[EdgeProgramManager, EtforgePartitioner, list[Partition]]:
    """Edge + NPU delegation in ExecuTorch's single pass; returns the converted partitions."""
    partitioner = EtforgePartitioner(target, options, reg)
    start = len(backend.CONVERTED)
    edge = to_edge_transform_and_lower(ep, partitioner=[partitioner], compile_config=edge_config())
    parts = [Partition(x.name, x.converted, x.payload, x.processed) for x in backend.CONVERTED[start:]]
    del backend.CONVERTED[start:]
    return edge, partitioner, parts
