"""CPU backends: how the leftovers of the NPU partitioning run on the target's CPU."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
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
    #: installed ``executorch`` package (or an absolute path: a plugin's own library).
    yaml: str
    #: Where the firmware build finds the C++ sources of its kernels: a directory relative to
    #: the ExecuTorch source tree ("" : a library the firmware does not compile per kernel).
    sources: str = ""


@dataclass(frozen=True)
class KernelArg:
    """One tensor of a kernel call, as ``CpuBackend.dim_order_problem`` sees it: the schema
    argument's name, the tensor's sizes and dim order, and whether the call writes it."""

    name: str
    sizes: tuple[int, ...]
    order: tuple[int, ...]
    out: bool = False

    def label(self) -> str:
        return f"{self.name}{list(self.sizes)} dim order {tuple(self.order)}"


@dataclass(frozen=True)
class HostArithmetic:
    """A CPU library's own kernels on the host, integer for integer what its C code computes
    on the device: ``etforge verify`` runs the library's ops of a program on ``kernels`` and
    holds their int8 values to ``reference``.

    ``kernels``: operator (``ns::op``, no overload) -> its out variant as a host function,
    taking the schema's arguments in order (``out`` last) and returning ``out``.
    ``reference``: ``reference(value, host_op)`` -> a function of a quantize node of the
    quantized program giving that node's device-exact int8 value (a tensor), computed from
    the values ``value(node)`` returns, for the library's op ``host_op``
    (``ns.op.overload``); it raises ``etforge.sdk.NotExact`` where it has no rule. None:
    the library's ops are held to torch's value, as ExecuTorch's portable kernels are.
    ``not_proven``: operator -> why its host kernel is not proven equal to the device
    (``verify`` prints it as a note whenever a program calls it).
    ``register``: called before a program runs on the host; registers the library's
    operators with torch (``torch.ops.<ns>``) when importing the plugin did not.
    ``reads``: operator -> {argument name: ``"bytes"`` (its kernel reads that tensor's
    elements in memory order and its sizes, never its strides) or ``"unread"`` (never read:
    CMSIS-NN's scratch buffers)}; any other argument counts as read whole. ``verify`` keys a
    repeated kernel call by what the kernel reads (``runtime.execution.kernel_memo``).
    """

    kernels: Mapping[str, Callable[..., Any]]
    reference: Callable[[Callable[[Any], Any], str], Callable[[Any], Any]] | None = None
    not_proven: Mapping[str, str] = field(default_factory=dict)
    register: Callable[[], None] | None = None
    reads: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


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
    #: Packages whose ``__init__`` a host run of a program does without (``etforge verify``
    #: defers them, ``core.common.lazy_imports``): ``HostArithmetic.register`` then imports
    #: the modules it needs itself, and any other name of the package runs its ``__init__``.
    host_deferred_inits: tuple[str, ...] = ()

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

    def host_arithmetic(self) -> HostArithmetic | None:
        """The host implementation of this backend's own ops (those in ``kernel_namespaces``):
        what ``verify`` runs them on and holds them to. None: the backend has no op of its own.
        Called once per process (load what it needs lazily)."""
        return None

    def dim_order_problem(self, op: str, args: Sequence[KernelArg]) -> str | None:
        """Why the device's C kernel for ``op`` (``ns::name``) refuses or miscomputes a call
        with these tensors' dim orders; None if it computes it right (the default: any order).
        ``etforge verify`` refuses a ``.pte`` any CPU backend finds a problem in."""
        return None

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "placement": self.placement}
