"""The op-converter contract: one class per op family, keyed by the Edge ops it handles.

Converters are described declaratively (op names are strings, limits are data) so that
listing them never imports torch; ``is_supported`` and ``convert`` receive torch.fx nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from torch.fx import Node

    from etforge.core.litert_convert import ConversionContext
    from etforge.core.target import TargetSpec


@dataclass(frozen=True)
class Support:
    """A support decision; ``reason`` says why not, for the report."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


SUPPORTED = Support(True)


def unsupported(reason: str) -> Support:
    return Support(False, reason)


class OpConverter:
    """Base class of op converters.

    Class attributes are the declarative description; override ``check`` for
    op-specific limits and ``convert`` to emit LiteRT operators through ``ctx``.
    """

    #: Edge op overloads handled, e.g. ``("aten.convolution.default",)``.
    ops: ClassVar[tuple[str, ...]] = ()
    #: ATen ops that ``to_edge_transform_and_lower`` must keep whole for this converter.
    preserve: ClassVar[tuple[str, ...]] = ()
    #: Higher wins when two converters claim one op; built-ins use 0.
    priority: ClassVar[int] = 0
    #: Target names or NPU families this converter applies to; ``None``: every NPU.
    targets: ClassVar[tuple[str, ...] | None] = None
    #: Element types handled: "int8" (quantized) and/or "float32".
    dtypes: ClassVar[tuple[str, ...]] = ("int8", "float32")
    #: Human-readable limits for ``etforge ops``.
    constraints: ClassVar[tuple[str, ...]] = ()

    @property
    def name(self) -> str:
        return type(self).__name__

    def applies_to(self, target: TargetSpec) -> bool:
        if target.npu is None:
            return False
        return self.targets is None or target.name in self.targets or target.npu.family in self.targets

    def is_supported(self, node: Node, target: TargetSpec) -> Support:
        """Dtype gate, then the op-specific ``check``."""
        from etforge.core.graph_utils import node_dtype

        dtype = node_dtype(node)
        if target.npu is not None and dtype not in target.npu.dtypes:
            return unsupported(
                f"{dtype}: the {target.npu.family} NPU runs {', '.join(target.npu.dtypes)} only"
            )
        if dtype not in self.dtypes:
            return unsupported(f"{dtype} not supported (handles {', '.join(self.dtypes)})")
        return self.check(node, target)

    def check(self, node: Node, target: TargetSpec) -> Support:
        return SUPPORTED

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        raise NotImplementedError(f"{self.name} does not implement convert()")

    def macs(self, node: Node) -> int:
        """Multiply-accumulates of this node, for the NPU coverage figures."""
        return 0

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ops": list(self.ops),
            "priority": self.priority,
            "targets": list(self.targets) if self.targets is not None else None,
            "dtypes": list(self.dtypes),
            "constraints": list(self.constraints),
        }


class Elementwise(OpConverter):
    """A declarative elementwise op: one Edge op, one LiteRT builtin, same-shaped output.

    Binary ops broadcast; int8 unary ops whose LiteRT kernel requires equal in/out
    quantization declare it with ``same_qparams`` (the quantizer rule shares them too).
    """

    litert: ClassVar[str] = ""
    options: ClassVar[dict[str, Any]] = {}
    arity: ClassVar[int] = 1

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        ctx.emit_elementwise(node, self.litert, self.arity, self.options)


def elementwise(
    op: str,
    litert: str,
    *,
    arity: int = 1,
    dtypes: tuple[str, ...] = ("int8", "float32"),
    options: dict[str, Any] | None = None,
    name: str | None = None,
    priority: int = 0,
    targets: tuple[str, ...] | None = None,
) -> OpConverter:
    """Build an :class:`Elementwise` converter from data (op, LiteRT builtin, dtypes)."""
    cls = type(
        name or f"{litert.title().replace('_', '')}Converter",
        (Elementwise,),
        {
            "ops": (op,),
            "litert": litert,
            "arity": arity,
            "dtypes": dtypes,
            "options": dict(options or {}),
            "priority": priority,
            "targets": targets,
        },
    )
    return cls()
