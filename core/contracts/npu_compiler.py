"""NPU compiler adapters: LiteRT partition -> device payload."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from etforge.core.contracts.target import TargetSpec


@dataclass(frozen=True)
class NpuPayload:
    """What the delegate blob carries. ``format`` tags it; ``host_only`` if no device code."""

    format: str
    data: bytes
    host_only: bool
    kernel_selection: str | None = None
    log: str = ""
    #: ExecuTorch backend id the device runtime registers for this payload (None: etforge's).
    runtime_backend_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PartitionIo:
    """How a partition's graph inputs and outputs lie in memory: the ExecuTorch dim order of
    each (in the LiteRT graph's I/O order), which is the byte order its LiteRT tensor holds."""

    input_dim_orders: tuple[tuple[int, ...], ...] = ()
    output_dim_orders: tuple[tuple[int, ...], ...] = ()


class NpuCompiler:
    """Base class of NPU compiler adapters (one per vendor toolchain)."""

    name: str = ""
    family: str = ""
    #: What the device's figure for a partition's working memory is, where etforge's host
    #: estimate is shown (report, CLI, model header); "" when the compiler says nothing.
    memory_note: str = ""

    def available(self) -> tuple[bool, str]:
        """Whether the toolchain can run here, and if not, why (shown to the user)."""
        return False, "not implemented"

    def target_problem(self, target: TargetSpec) -> str:
        """Why this compiler cannot build for ``target``'s chip ("" if it can, or cannot tell):
        asked when the target is made for a compile, so a chip the toolchain refuses is refused
        even when no partition would reach it."""
        return ""

    def compile(
        self, tflite: bytes, target: TargetSpec, options: dict[str, Any], partition: str
    ) -> NpuPayload:
        raise NotImplementedError

    def compile_io(
        self, tflite: bytes, target: TargetSpec, options: dict[str, Any], partition: str, io: PartitionIo
    ) -> NpuPayload:
        """``compile``, told how the partition's I/O lie in memory (a device runtime may need
        to know, e.g. which tensors are channels-last); by default the layout is not needed."""
        return self.compile(tflite, target, options, partition)

    def describe(self) -> dict[str, Any]:
        ok, why = self.available()
        return {"name": self.name, "family": self.family, "available": ok, "status": why}
