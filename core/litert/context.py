"""What an op converter sees while one partition becomes a LiteRT flatbuffer.

:class:`ConversionContext` holds the partition's constants (compile-time values, folded and
laid out once) and runtime values (LiteRT tensors, each with the layout it is stored in), and
emits LiteRT operators attributed to the Edge nodes they came from. The loop that walks a
partition and the nodes the core converts itself are in ``core.litert.convert``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.export import ExportedProgram
from torch.fx import Node

from etforge.core.common.errors import ConversionError
from etforge.core.contracts.converter import OpConverter, folding
from etforge.core.contracts.target import TargetSpec
from etforge.core.graph import layout
from etforge.core.graph.utils import (
    is_dequantize,
    is_quantize,
    node_op,
    quantize_through_moves,
    shape_of,
    tensor_meta,
)
from etforge.core.litert.builder import LiteRTBuilder, Quant, enum, options

if TYPE_CHECKING:
    from etforge.core.registry.manager import Registry

#: Node meta key where the partitioner records the converter that accepted the node,
#: as ``(plugin, converter name)``: conversion uses it instead of asking again.
DECIDED_KEY = "etforge_converter"


#: LiteRT element type of each torch dtype a tensor may have.
TORCH_DTYPES = {torch.float32: "float32", torch.int8: "int8", torch.int32: "int32", torch.uint8: "uint8"}


@dataclass
class Value:
    """A runtime tensor of the LiteRT graph; ``perm`` maps the logical (Edge) layout to storage."""

    tensor: int
    shape: tuple[int, ...]
    perm: tuple[int, ...]
    dtype: str
    quant: Quant | None
    #: For a flattened channels-last tensor kept in stored order (no TRANSPOSE): the
    #: logical column each stored column holds. Only fully-connected consumers accept it.
    columns: tuple[int, ...] | None = None

    @property
    def stored_shape(self) -> tuple[int, ...]:
        return layout.apply(self.shape, self.perm)

    @property
    def rank(self) -> int:
        return len(self.shape)


@dataclass
class Constant:
    """A compile-time tensor in logical layout (int8 with ``quant`` for quantized weights)."""

    data: np.ndarray
    dtype: str
    quant: Quant | None = None
    name: str = "const"
    _tensors: dict[tuple[int, ...], int] = field(default_factory=dict)


def constant_value(ep: ExportedProgram, node: Node) -> torch.Tensor | None:
    """The value of a lifted parameter / buffer / constant placeholder (None for an input).

    One pass over the input specs: the signature's ``inputs_to_*`` tables are properties that
    build a new dict per read (three per call, per constant argument: half a float
    partition's conversion in verify's float check)."""
    from torch.export.graph_signature import InputKind, TensorArgument

    name = node.target
    for spec in ep.graph_signature.input_specs:
        if spec.kind not in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            continue
        if (
            not isinstance(spec.arg, TensorArgument)
            or spec.arg.name != name
            or not isinstance(spec.target, str)
        ):
            continue
        key = spec.target
        value = (ep.constants if spec.kind == InputKind.CONSTANT_TENSOR else ep.state_dict).get(key)
        if value is None and key in ep.constants:
            value = ep.constants[key]
        return value.detach() if isinstance(value, torch.Tensor) else None
    return None


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().contiguous().numpy()


class ConversionContext:
    """What a converter sees: inputs as LiteRT tensors in a layout it asks for, and ``emit``."""

    def __init__(
        self,
        ep: ExportedProgram,
        target: TargetSpec,
        name: str = "partition",
        converters: dict[str, list[OpConverter]] | None = None,
    ) -> None:
        self.ep = ep
        self.target = target
        #: op -> candidate converters (highest priority first): who to ask about a user node.
        self.converters = converters or {}
        #: op -> the converter that computes it at compile time from a constant input.
        self._folds = folding(c for cs in self.converters.values() for c in cs)
        self.builder = LiteRTBuilder(description=f"etforge:{name}")
        self.values: dict[Node, Value] = {}
        self.constants: dict[Node, Constant] = {}
        self.absorbed: set[Node] = set()
        self.current: Node | None = None
        self.debug_map: dict[int, list[int]] = {}
        self.op_nodes: dict[int, list[str]] = {}
        self._transposes: dict[tuple[int, tuple[int, ...], tuple[int, ...]], int] = {}
        self._group: list[Node] = []
        self._accepts_columns = False
        self.input_dim_orders: list[tuple[int, ...]] = []
        self.output_dim_orders: list[tuple[int, ...]] = []
        #: Edge quantize node -> (LiteRT tensor, layout) holding its int8 value: lets a host
        #: check compare every op with the reference op fed the same inputs.
        self.int8_values: dict[str, Value] = {}
        #: float values an op produced (float partitions): verify's float check reads them
        self.float_values: dict[str, Value] = {}

    def input_columns(self, arg: object) -> Value:
        """Like ``input`` in identity layout, but may return a column-reordered flatten."""
        self._accepts_columns = True
        try:
            v = self.value(arg)
            return v if v.columns is not None else self.input(arg, layout.identity(v.rank))
        finally:
            self._accepts_columns = False

    # -- constants ---------------------------------------------------------------------------
    def constant(self, arg: object) -> Constant | None:
        """The compile-time value of ``arg`` (a parameter, buffer, or DQ of one), else None."""
        if not isinstance(arg, Node):
            return None
        if arg in self.constants:
            return self.constants[arg]
        const: Constant | None = None
        if arg.op == "placeholder":
            t = constant_value(self.ep, arg)
            if t is not None:
                const = Constant(
                    _np(t), TORCH_DTYPES.get(t.dtype, str(t.dtype).removeprefix("torch.")), name=arg.name
                )
        elif is_dequantize(arg):
            src = self.constant(arg.args[0])
            if src is not None:
                const = Constant(src.data, src.dtype, self.qdq_quant(arg), name=arg.name)
        elif (folder := self._folds.get(node_op(arg))) is not None and arg.args:
            src = self.constant(arg.args[0])
            if src is not None:
                const = folder.fold_constant(arg, src)
        elif arg.op == "get_attr":
            t = getattr(self.ep.graph_module, str(arg.target))
            const = Constant(_np(t), TORCH_DTYPES.get(t.dtype, "float32"), name=arg.name)
        if const is not None:
            self.constants[arg] = const
        return const

    def is_constant(self, arg: object) -> bool:
        return self.constant(arg) is not None

    def qdq_quant(self, dq: Node) -> Quant:
        """Quantization parameters carried by a quantize/dequantize node's arguments."""
        args = dq.args
        if "per_channel" in node_op(dq):
            scales, zps = self.constant(args[1]), self.constant(args[2])
            if scales is None or zps is None:
                raise ConversionError(dq, node_op(dq), "per-channel scales/zero points are not constant")
            return Quant(
                tuple(float(s) for s in scales.data.reshape(-1)),
                tuple(int(z) for z in zps.data.reshape(-1)),
                int(args[3]),
            )
        scale, zp = args[1], args[2]
        if isinstance(scale, Node) or isinstance(zp, Node):
            s, z = self.constant(scale), self.constant(zp)
            if s is None or z is None:
                raise ConversionError(dq, node_op(dq), "dynamic quantization parameters are not supported")
            return Quant.per_tensor(float(s.data.reshape(-1)[0]), int(z.data.reshape(-1)[0]))
        return Quant.per_tensor(float(scale), int(zp))

    def constant_tensor(
        self, const: Constant, perm: Sequence[int] | None = None, dtype: str | None = None
    ) -> int:
        """Materialize a constant as a LiteRT tensor, permuted at conversion time."""
        perm = tuple(perm) if perm is not None else layout.identity(const.data.ndim)
        if perm in const._tensors and dtype is None:
            return const._tensors[perm]
        data = np.transpose(const.data, perm) if const.data.ndim else const.data
        quant = const.quant
        if quant is not None and quant.per_channel:
            quant = Quant(quant.scale, quant.zero_point, layout.stored_axis(perm, quant.axis))
        index = self.builder.add_tensor(data.shape, dtype or const.dtype, const.name, data=data, quant=quant)
        if dtype is None:
            const._tensors[perm] = index
        return index

    def add_constant(self, data: np.ndarray, dtype: str, name: str, quant: Quant | None = None) -> int:
        return self.builder.add_tensor(data.shape, dtype, name, data=np.asarray(data), quant=quant)

    # -- runtime values ----------------------------------------------------------------------
    def value(self, arg: object) -> Value:
        """The runtime value of ``arg`` as stored (no layout change)."""
        if isinstance(arg, Node) and arg in self.values:
            return self.values[arg]
        const = self.constant(arg)
        if const is not None:
            index = self.constant_tensor(const)
            return Value(
                index, tuple(const.data.shape), layout.identity(const.data.ndim), const.dtype, const.quant
            )
        raise ConversionError(
            self.current, node_op(self.current) if self.current else "?", f"input {arg} has no value yet"
        )

    def input(self, arg: object, perm: Sequence[int] | None = None) -> Value:
        """``arg`` as a LiteRT tensor stored in layout ``perm`` (None: as it is)."""
        const = self.constant(arg)
        if const is not None and not (isinstance(arg, Node) and arg in self.values):
            p = tuple(perm) if perm is not None else layout.identity(const.data.ndim)
            return Value(self.constant_tensor(const, p), tuple(const.data.shape), p, const.dtype, const.quant)
        v = self.value(arg)
        if v.columns is not None and not self._accepts_columns:
            raise ConversionError(
                self.current, node_op(self.current), "input is a reordered flatten; only FC may consume it"
            )
        if perm is None or tuple(perm) == v.perm:
            return v
        return self.relayout(v, tuple(perm))

    def relayout(self, v: Value, perm: tuple[int, ...]) -> Value:
        """Insert (once per stored tensor, its layout and the new one) a TRANSPOSE or a free
        RESHAPE. The key holds ``v.perm``: aliases of one tensor (a permute relabels, moving
        no data) store it under other layouts, and each needs its own transpose."""
        key = (v.tensor, v.perm, perm)
        if key in self._transposes:
            return Value(self._transposes[key], v.shape, perm, v.dtype, v.quant)
        shape = layout.apply(v.shape, perm)
        out = self.builder.add_tensor(
            shape, v.dtype, f"{self.builder.tensors[v.tensor].name}/{''.join(map(str, perm))}", quant=v.quant
        )
        if layout.is_trivial(v.stored_shape, layout.transpose_between(v.perm, perm)):
            shape_t = self.add_constant(np.asarray(shape, np.int32), "int32", "shape")
            self.emit("RESHAPE", [v.tensor, shape_t], [out], options("ReshapeOptions", newShape=list(shape)))
        else:
            perm_t = self.add_constant(
                np.asarray(layout.transpose_between(v.perm, perm), np.int32), "int32", "perm"
            )
            self.emit("TRANSPOSE", [v.tensor, perm_t], [out], options("TransposeOptions"))
        self._transposes[key] = out
        return Value(out, v.shape, perm, v.dtype, v.quant)

    def fuse_activation(self, node: Node) -> tuple[str, Node]:
        """Absorb a single-user activation after ``node`` if the target can fuse it.

        Returns the LiteRT fused-activation name ("NONE" if none) and the node whose value
        the fused op produces.
        """
        users = list(node.users)
        if len(users) != 1 or users[0].op != "call_function":
            return "NONE", node
        user = users[0]
        candidates = self.converters.get(node_op(user), [])
        decided = decided_converter(user, candidates)  # the converter the partitioner chose
        act = next(
            (a for c in ([decided] if decided else candidates) if (a := c.fused_activation(user))),
            None,
        )
        npu = self.target.npu
        if act is None or npu is None or act not in npu.fused_activations:
            return "NONE", node
        self.absorbed.add(user)
        self._group.append(user)
        return act, user

    def output(
        self,
        node: Node,
        perm: Sequence[int] | None = None,
        shape: Sequence[int] | None = None,
        like: Value | None = None,
    ) -> Value:
        """Create the LiteRT tensor that ``node`` produces, stored in layout ``perm``.

        Quantized when the node feeds a quantize node (whose qparams it adopts); that
        quantize node and its dequantize users become aliases of this value. ``like``: the
        value a data-movement op (reshape, slice, select) moves: an int8 output keeps its
        qparams (a quantize user with others requantizes after it). Such an output is the middle of an int8
        chain (``DQ -> slice -> squeeze -> Q``, a decomposed matmul's ``view``): the
        partitioner admits an int8 node only when every user of an unquantized output is on
        the NPU too.
        """
        logical = tuple(shape) if shape is not None else shape_of(node)
        perm = tuple(perm) if perm is not None else layout.identity(len(logical))
        q_users = [u for u in node.users if is_quantize(u)]
        if like is not None and like.dtype == "int8":
            # Data movement cannot rescale: a quantize user with other qparams stays its own
            # op (convert_quantize requantizes), as in the PT2E graph.
            quant, dtype = like.quant, "int8"
            q_users = [q for q in q_users[:1] if self.qdq_quant(q) == quant]
        elif q_users:
            quant, dtype = self.qdq_quant(q_users[0]), "int8"
        elif (moved_to := quantize_through_moves(node)) is not None:
            # e.g. a decomposed matmul's bmm -> view -> Q: the view moves these codes on
            quant, dtype = self.qdq_quant(moved_to), "int8"
        else:
            val = tensor_meta(node)
            quant, dtype = None, TORCH_DTYPES.get(val.dtype, "float32") if val is not None else "float32"
        index = self.builder.add_tensor(layout.apply(logical, perm), dtype, node.name, quant=quant)
        v = Value(index, logical, perm, dtype, quant)
        self.values[node] = v
        if q_users:
            self.values[q_users[0]] = v
            self.int8_values[q_users[0].name] = v
        elif dtype == "float32":
            self.float_values[node.name] = v
        return v

    def alias(self, node: Node, v: Value) -> None:
        """``node`` is ``v`` relabelled (no data moves): e.g. a permute, a clone."""
        self.values[node] = v
        q_users = [u for u in node.users if is_quantize(u)]
        if q_users and self.qdq_quant(q_users[0]) == v.quant:
            self.values[q_users[0]] = v

    def output_quant(self, node: Node) -> Quant | None:
        """The qparams ``node``'s value gets (from its quantize user), None if float."""
        q = [u for u in node.users if is_quantize(u)]
        return self.qdq_quant(q[0]) if q else None

    def temp(self, shape: Sequence[int], dtype: str, name: str, quant: Quant | None = None) -> int:
        """An intermediate LiteRT tensor (stored shape) that no Edge node owns."""
        return self.builder.add_tensor(tuple(shape), dtype, f"{self.current.name}/{name}", quant=quant)

    def reshape(self, src: Value | int, dst: Value | int, stored_shape: Sequence[int]) -> None:
        shape_t = self.add_constant(np.asarray(stored_shape, np.int32), "int32", "shape")
        self.emit(
            "RESHAPE",
            [src, shape_t],
            [dst],
            options("ReshapeOptions", newShape=[int(d) for d in stored_shape]),
        )

    def emit(
        self,
        builtin: str,
        inputs: Sequence[int | Value],
        outputs: Sequence[int | Value],
        opts: Any = None,
        custom: str = "",
        custom_options: bytes | None = None,
    ) -> int:
        """Append a LiteRT operator attributed to the node being converted (and its fused nodes)."""
        ins = [i.tensor if isinstance(i, Value) else int(i) for i in inputs]
        outs = [o.tensor if isinstance(o, Value) else int(o) for o in outputs]
        group = [n for n in [self.current, *self._group] if n is not None]
        index = self.builder.add_operator(
            builtin,
            ins,
            outs,
            opts,
            name=group[0].name if group else "",
            custom=custom,
            custom_options=custom_options,
        )
        self.debug_map[index] = sorted(
            {int(h) for n in group if (h := n.meta.get("debug_handle")) is not None}
        )
        self.op_nodes[index] = [n.name for n in group]
        return index

    def emit_elementwise(
        self, node: Node, builtin: str, arity: int, opts: dict[str, Any], kind: str | None = None
    ) -> Value:
        """Elementwise op with broadcasting: operands take the first runtime input's layout.
        ``kind`` names the builtin's options table (``"AddOptions"``), if it has one."""
        args = list(node.args[:arity])
        rank = len(shape_of(node))
        runtime = [a for a in args if isinstance(a, Node) and not self.is_constant(a)]
        perm = self._cheapest_layout([self.value(a) for a in runtime], rank)
        int8 = any(self.value(a).dtype == "int8" for a in runtime)
        ins = [self.broadcast_input(a, rank, perm, int8) for a in args]
        fields = dict(opts)
        out_node = node
        if kind is not None and hasattr(options(kind), "fusedActivationFunction"):
            act, out_node = self.fuse_activation(node)
            fields["fusedActivationFunction"] = activation(act)
        out = self.output(out_node, perm)
        self.emit(builtin, ins, [out], options(kind, **fields) if kind else None)
        return out

    def _cheapest_layout(self, values: list[Value], rank: int) -> tuple[int, ...]:
        """The operands' layout needing the fewest new TRANSPOSEs (ties: channels-last)."""
        candidates = {v.perm for v in values if v.rank == rank} or {layout.identity(rank)}

        def cost(perm: tuple[int, ...]) -> tuple[int, bool]:
            new = sum(
                1
                for v in values
                if v.rank == rank and v.perm != perm and (v.tensor, v.perm, perm) not in self._transposes
            )
            return new, perm != layout.channels_last(rank)

        return min(sorted(candidates), key=cost)

    def broadcast_input(self, arg: object, rank: int, perm: tuple[int, ...], int8: bool = False) -> Value:
        """An elementwise operand raised to ``rank`` (leading 1s), stored in ``perm``.

        A float constant meeting int8 operands is quantized here, symmetric, with its own scale.
        """
        if not isinstance(arg, Node):
            raise ConversionError(
                self.current, node_op(self.current), f"scalar operand {arg!r} should be a tensor"
            )
        const = self.constant(arg)
        if const is not None:
            data = const.data.reshape((1,) * (rank - const.data.ndim) + const.data.shape)
            quant, dtype = const.quant, const.dtype
            if quant is not None and quant.per_channel:
                quant = Quant(quant.scale, quant.zero_point, quant.axis + rank - const.data.ndim)
            if int8 and quant is None:
                scale = float(np.abs(data).max()) / 127.0 or 1.0
                data = np.clip(np.round(data / scale), -127, 127).astype(np.int8)
                quant, dtype = Quant.per_tensor(scale, 0), "int8"
            c = Constant(data, dtype, quant, const.name)
            return Value(self.constant_tensor(c, perm), data.shape, perm, c.dtype, c.quant)
        v = self.value(arg)
        if v.rank != rank:
            v = self.input(arg, layout.identity(v.rank))
            shape = (1,) * (rank - v.rank) + v.shape
            out = self.builder.add_tensor(shape, v.dtype, f"{arg.name}/rank{rank}", quant=v.quant)
            self.reshape(v, out, shape)
            v = Value(out, shape, layout.identity(rank), v.dtype, v.quant)
        return self.relayout(v, perm) if v.perm != perm else v


def padding(name: str) -> int:
    """LiteRT's ``Padding`` enum value by name ("SAME", "VALID")."""
    return enum("Padding", name)


def activation(name: str) -> int:
    """LiteRT's fused-activation enum value by name ("NONE", "RELU", ...)."""
    return enum("ActivationFunctionType", name)


def decided_converter(
    node: Node, candidates: Sequence[OpConverter], reg: Registry | None = None
) -> OpConverter | None:
    """The converter the partitioner chose for ``node`` (recorded in its meta), if any."""
    who = node.meta.get(DECIDED_KEY)
    if not who:
        return None
    plugin, name = who
    for op_converter in candidates:
        if op_converter.name == name and (reg is None or reg.owner(op_converter) == plugin):
            return op_converter
    return None
