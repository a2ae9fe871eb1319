"""The op-converter contract: one class per op family, keyed by the Edge ops it handles.

Converters are described declaratively (op names are strings, limits are data) so that
listing them never imports torch; ``is_supported`` and ``convert`` receive torch.fx nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from torch.fx import Node

    from etforge.core.contracts.target import TargetSpec
    from etforge.core.litert.context import Constant, ConversionContext


#: ``OpConverter.targets`` of a converter that serves every NPU: its checks read only the
#: target's ``NpuSpec`` (and name what they read in ``reads``).
EVERY_NPU: tuple[str, ...] = ("*",)


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


@dataclass(frozen=True)
class Constraint:
    """A limit a converter both advertises (``etforge ops``) and enforces.

    ``test(node, target)`` returns True (or "") when the node satisfies the limit, else False
    or a string with the details; :meth:`OpConverter.is_supported` runs every constraint
    before ``check``, so what ``etforge ops`` lists is what the support check decides on.
    (A plain string in ``constraints`` is accepted but only documents; ``etforge plugins``
    warns that it is not checked.)
    """

    text: str
    test: Callable[[Node, TargetSpec], bool | str]

    def evaluate(self, node: Node, target: TargetSpec) -> Support:
        got = self.test(node, target)
        if got is True or got == "":
            return SUPPORTED
        detail = got if isinstance(got, str) else ""
        return unsupported(f"{self.text}: {detail}" if detail else f"not {self.text}")


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
    #: The NPUs this converter serves: target names or NPU families, or :data:`EVERY_NPU`
    #: (written against ``NpuSpec`` data alone, as the built-in converters are). ``None`` (not
    #: said): only NPUs that take undeclared converters (``NpuSpec.takes_undeclared_converters``,
    #: e.g. the host ``litert`` target), so a converter never reaches a chip's NPU unasked.
    targets: ClassVar[tuple[str, ...] | None] = None
    #: The NPU names (``limits`` / ``choices`` keys, ``requires`` flags) the support check reads:
    #: each must be declared by a loaded NPU spec (``NpuSpec.declares``) or the plugin fails to
    #: load, naming it (a misspelt key would read as "no limit").
    reads: ClassVar[tuple[str, ...]] = ()
    #: Element types handled: "int8" (quantized) and/or "float32".
    dtypes: ClassVar[tuple[str, ...]] = ("int8", "float32")
    #: Limits, shown by ``etforge ops``: :class:`Constraint` (checked by ``is_supported``)
    #: or plain text (documentation only; ``etforge plugins`` warns about it).
    constraints: ClassVar[tuple[Constraint | str, ...]] = ()
    #: LiteRT builtins ``convert`` emits (besides ``litert``): checked against the schema at load.
    litert_ops: ClassVar[tuple[str, ...]] = ()
    #: Edge ops whose value this converter computes at compile time when their input is a
    #: constant (a permute of a weight is a permuted weight): the core counts such a node as
    #: a constant (``is_constant``) and asks :meth:`fold_constant` for its value.
    folds: ClassVar[tuple[str, ...]] = ()
    #: The op only moves or relabels values (reshape, permute, expand, clone, slice ...): on
    #: int8 codes it gives codes on the same grid. The partitioner then sees int8 values
    #: through a chain of such ops from a dequantize or to a quantize, as a decomposition
    #: after quantization leaves them (``matmul`` -> expand, clone, view, bmm, view).
    moves_codes: ClassVar[bool] = False

    @property
    def name(self) -> str:
        return type(self).__name__

    def fold_constant(self, node: Node, value: Constant) -> Constant:
        """The value of ``node`` (an op in :attr:`folds`) whose input has the value ``value``."""
        raise NotImplementedError(f"{self.name} lists {node.target} in folds but has no fold_constant")

    def applies_to(self, target: TargetSpec) -> bool:
        """Whether this converter is asked about ``target``'s nodes (see :attr:`targets`)."""
        if target.npu is None:
            return False
        if self.targets is None:
            return target.npu.takes_undeclared_converters
        return (
            EVERY_NPU[0] in self.targets or target.name in self.targets or target.npu.family in self.targets
        )

    def is_supported(self, node: Node, target: TargetSpec) -> Support:
        """Dtype gate, then the structured constraints, then the op-specific ``check``."""
        from etforge.core.graph.utils import node_dtype

        dtype = node_dtype(node)
        if target.npu is not None and dtype not in target.npu.dtypes:
            return unsupported(
                f"{dtype}: the {target.npu.family} NPU runs {', '.join(target.npu.dtypes)} only"
            )
        if dtype not in self.dtypes:
            return unsupported(f"{dtype} not supported (handles {', '.join(self.dtypes)})")
        for c in self.constraints:
            if isinstance(c, Constraint):
                s = c.evaluate(node, target)
                if not s.ok:
                    return s
        return self.check(node, target)

    def check(self, node: Node, target: TargetSpec) -> Support:
        return SUPPORTED

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        raise NotImplementedError(f"{self.name} does not implement convert()")

    def macs(self, node: Node) -> int:
        """Multiply-accumulates of this node, for the NPU coverage figures."""
        return 0

    def is_noop(self, node: Node, target: TargetSpec, constant: Callable[[Node], Any] | None = None) -> bool:
        """True when ``node`` (which this converter accepted) computes nothing on ``target``:
        its output is its input (a view, a clone, a scale-1 resize, a clamp that quantization
        collapsed ...) or a compile-time constant. A target whose NPU compiler drops such ops
        sets the ``partition_needs_compute`` requirement, and the partitioner then keeps a
        partition of no-ops only off the NPU (it would compile to an empty graph).

        ``constant(n)`` gives the value of a compile-time tensor ``n`` (None if it is not one).
        """
        return False

    def fused_activation(self, node: Node) -> str | None:
        """The LiteRT fused-activation name (e.g. of a clamp) when ``node``, an op this
        converter handles, can fold into its producer's output; None: it cannot.

        Producers ask through ``ctx.fuse_activation``; the core knows no activation op.
        """
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ops": list(self.ops),
            "priority": self.priority,
            "targets": list(self.targets) if self.targets is not None else None,
            "reads": list(self.reads),
            "dtypes": list(self.dtypes),
            "constraints": [c.text if isinstance(c, Constraint) else c for c in self.constraints],
            "unchecked_constraints": [c for c in self.constraints if isinstance(c, str)],
        }


class Elementwise(OpConverter):
    """A declarative elementwise op: one Edge op, one LiteRT builtin, same-shaped output.

    Binary ops broadcast; int8 unary ops whose LiteRT kernel requires equal in/out
    quantization declare it with ``same_qparams`` (the quantizer rule shares them too).
    """

    litert: ClassVar[str] = ""
    options: ClassVar[dict[str, Any]] = {}
    #: The builtin's LiteRT options table (``"AddOptions"``), if it has one: when the table
    #: has a ``fusedActivationFunction`` field, a following activation fuses into the op.
    options_table: ClassVar[str | None] = None
    arity: ClassVar[int] = 1

    def convert(self, node: Node, ctx: ConversionContext) -> None:
        ctx.emit_elementwise(node, self.litert, self.arity, self.options, self.options_table)


def folding(converters: Iterable[OpConverter]) -> dict[str, OpConverter]:
    """Edge op -> the first of ``converters`` that folds it (:attr:`OpConverter.folds`)."""
    out: dict[str, OpConverter] = {}
    for op_converter in converters:
        for op in op_converter.folds:
            out.setdefault(op, op_converter)
    return out


def elementwise(
    op: str,
    litert: str,
    *,
    arity: int = 1,
    dtypes: tuple[str, ...] = ("int8", "float32"),
    options: dict[str, Any] | None = None,
    options_table: str | None = None,
    name: str | None = None,
    priority: int = 0,
    targets: tuple[str, ...] | None = None,
    reads: tuple[str, ...] = (),
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
            "options_table": options_table,
            "priority": priority,
            "targets": targets,
            "reads": reads,
        },
    )
    return cls()


def moving_ops(converters: Iterable[OpConverter]) -> frozenset[str]:
    """The ops of the ``converters`` that say they only move codes (:attr:`OpConverter.moves_codes`):
    one list for the partitioner, the conversion and verify's device-exact reference."""
    return frozenset(op for c in converters if c.moves_codes for op in c.ops)
