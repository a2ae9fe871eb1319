"""CPU backends: how the leftovers of the NPU partitioning run on the target's CPU."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from executorch.exir import EdgeCompileConfig
    from torch.export import ExportedProgram
    from torchao.quantization.pt2e.quantizer import Quantizer

    from etforge.core.contracts.target import TargetSpec


#: Where a CPU backend's ``lower`` leaves lines for the report's notes (a list of str).
LOWERING_NOTES_KEY = "etforge_lowering_notes"


@dataclass(frozen=True)
class KernelLibrary:
    """A kernel library a CPU backend's firmware links; the core checks every CPU op against
    the operators its yaml lists (``core.lower.kernel_check``) before anything is written."""

    #: Short name (the firmware build's and ``etforge codegen --libraries``' name for it).
    name: str
    #: What messages call it ("ExecuTorch portable").
    title: str
    #: Its operator list: an ExecuTorch ``functions.yaml``-style file, relative to the
    #: installed ``executorch`` package.
    yaml: str


class CpuBackend:
    """Base class: a CPU backend runs what the NPU does not take, on the kernels it links."""

    name: str = ""
    description: str = ""
    #: Placement label in the report for the ops this backend runs.
    placement: str = "portable"
    #: Kernels that work in NHWC (CMSIS-NN): the program keeps 4-D tensors channels-last, so
    #: NPU partitions and these kernels hand buffers over without a layout conversion.
    channels_last: bool = False
    #: The kernel libraries the firmware links, in lookup order; every backend declares them
    #: (a backend without any has no kernel for any op).
    kernel_libraries: tuple[KernelLibrary, ...] = ()
    #: Op namespaces of this backend's own kernels (its custom-op library): a CPU op in one
    #: of them runs on these kernels; any other fell back to ExecuTorch's portable kernels.
    kernel_namespaces: tuple[str, ...] = ()
    #: This backend's ops that only move data between layouts (``namespace.op``, no
    #: overload), counted by the report's ``cpu_layout_conversions``.
    layout_ops: tuple[str, ...] = ()
    #: The lowering folds Q/DQ into the ops between them, so each op computes its int8
    #: output from its int8 inputs: an op whose values come from no input value
    #: (``zeros_like``, ``full``) would produce the wrong int8 values, and the
    #: ``ValueOpsAsConstants`` rewrite turns those into constants before quantization.
    folds_qdq: bool = False
    #: This backend's own quantize / dequantize ops (``namespace.op.overload``) beside
    #: ``quantized_decomposed``'s, which every backend understands: what reads a program's
    #: int8 outputs (``etforge.testing.check_op``) asks here, never for a namespace by name.
    quantize_ops: tuple[str, ...] = ()
    dequantize_ops: tuple[str, ...] = ()

    def quantizer(self, target: TargetSpec, options: dict[str, Any]) -> Quantizer | None:
        """A PT2E quantizer for the nodes the NPU rules left unannotated (None: none)."""
        return None

    def edge_compile_config(self) -> EdgeCompileConfig | None:
        return None

    def lower(self, ep: ExportedProgram, target: TargetSpec, options: dict[str, Any]) -> ExportedProgram:
        """Rewrite the leftover Edge ops into this backend's kernels (identity by default).

        Lines for the report's ``notes`` (what the lowering changed that the user should know)
        go in ``ep.graph_module.meta[LOWERING_NOTES_KEY]`` of the returned program."""
        return ep

    def runs(self, op: str) -> bool:
        """Whether the CPU op ``op`` (``namespace.op.overload``) is one of this backend's kernels."""
        return op.split(".", 1)[0] in self.kernel_namespaces

    def isa(self, target: TargetSpec, options: dict[str, Any]) -> str | None:
        """The instruction-set variant the kernels were chosen for (the report's ``isa``)."""
        return None

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "placement": self.placement}
