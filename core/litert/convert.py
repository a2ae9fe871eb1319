"""Convert one Edge partition (an ExportedProgram) to a LiteRT flatbuffer.

The core owns what is structural — Q/DQ folding into int8 tensors, constants, layouts,
graph inputs and outputs — and asks op converters (plugins) for everything else, through the
:class:`~etforge.core.litert.context.ConversionContext`. Each emitted LiteRT operator records
the Edge nodes it came from as it is emitted, so the debug-handle map exists by construction.
"""

from __future__ import annotations

import json
import operator
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.export import ExportedProgram
from torch.fx import Node

from etforge.core.common.errors import ConversionError, PluginError
from etforge.core.contracts.converter import OpConverter, Support, moving_ops
from etforge.core.contracts.target import TargetSpec
from etforge.core.graph import layout
from etforge.core.graph.utils import (
    dim_order,
    is_dequantize,
    is_quantize,
    mark_constants,
    mark_moved_codes,
    node_op,
    tensor_meta,
)
from etforge.core.litert.builder import Quant, options
from etforge.core.litert.context import (
    TORCH_DTYPES,
    ConversionContext,
    Value,
    decided_converter,
)

if TYPE_CHECKING:
    from etforge.core.registry.manager import Registry


@dataclass
class Converted:
    """The result of converting one partition."""

    tflite: bytes
    debug_map: dict[int, list[int]]  # LiteRT op index -> Edge debug handles
    op_nodes: dict[int, list[str]]  # LiteRT op index -> Edge node names
    operators: list[str]  # LiteRT builtin name per op
    input_names: list[str]
    output_names: list[str]
    #: ExecuTorch dim order of each graph input/output: the LiteRT tensor holds the bytes
    #: in that order, so a channels-last neighbour hands over its buffer as it is.
    input_dim_orders: list[tuple[int, ...]] = field(default_factory=list)
    output_dim_orders: list[tuple[int, ...]] = field(default_factory=list)
    seconds: float = 0.0


# -- the nodes the core converts itself ------------------------------------------------------
def add_graph_input(ctx: ConversionContext, node: Node) -> None:
    """A graph input: a LiteRT input tensor stored in the node's dim order."""
    val = tensor_meta(node)
    if val is None:
        raise ConversionError(node, "placeholder", "graph input is not a tensor")
    dtype = TORCH_DTYPES.get(val.dtype)
    if dtype is None:
        raise ConversionError(node, "placeholder", f"graph input dtype {val.dtype} is not supported")
    quant = None
    if dtype == "int8":
        dqs = [u for u in node.users if is_dequantize(u)]
        if not dqs:
            raise ConversionError(node, "placeholder", "int8 graph input without quantization parameters")
        quant = ctx.qdq_quant(dqs[0])
    shape = tuple(int(d) for d in val.shape)
    perm = dim_order(node)
    index = ctx.builder.add_tensor(layout.apply(shape, perm), dtype, node.name, quant=quant)
    ctx.builder.inputs.append(index)
    ctx.values[node] = Value(index, shape, perm, dtype, quant)
    ctx.input_dim_orders.append(perm)


def convert_dequantize(ctx: ConversionContext, node: Node) -> None:
    """A dequantize: int8 consumers read the int8 tensor itself (weights are constants)."""
    if ctx.is_constant(node):
        return  # weights: consumed through ctx.constant()
    src = ctx.value(node.args[0])
    ctx.values[node] = src  # the int8 tensor *is* the dequantized value for int8 consumers


def convert_quantize(ctx: ConversionContext, node: Node) -> None:
    """A quantize its producer did not adopt: QUANTIZE, or a MUL by 1.0 to requantize int8."""
    if node in ctx.values:
        return  # adopted by its producer
    src_node = node.args[0]
    src = ctx.value(src_node)
    quant = ctx.qdq_quant(node)
    if src.dtype == "int8" and src.quant == quant:
        ctx.values[node] = src
        return
    ctx.current = node
    out = ctx.builder.add_tensor(src.stored_shape, "int8", node.name, quant=quant)
    if src.dtype == "int8" and src.quant is not None and quant is not None:
        # int8 -> int8 requantization as MUL by an exact 1.0: LiteRT's default (XNNPACK)
        # QUANTIZE rescales with a coarse fixed-point multiplier and lands one step off on
        # ~3% of values; MUL rescales in float, as the PT2E reference does.
        one = ctx.add_constant(np.asarray([127], np.int8), "int8", "one", Quant.per_tensor(1 / 127, 0))
        ctx.emit("MUL", [src, one], [out], options("MulOptions"))
    else:
        ctx.emit("QUANTIZE", [src], [out])
    ctx.values[node] = Value(out, src.shape, src.perm, "int8", quant)
    ctx.int8_values[node.name] = ctx.values[node]


def add_graph_outputs(ctx: ConversionContext, outputs: Sequence[object]) -> list[str]:
    """The graph outputs, each a distinct computed tensor in its node's dim order."""
    names = []
    for arg in outputs:
        if not isinstance(arg, Node):
            raise ConversionError(arg, "output", "non-tensor graph output")
        v = ctx.value(arg)
        ctx.current = arg
        wanted = dim_order(arg)
        v = ctx.input(arg, wanted) if v.perm != wanted or v.columns is not None else v
        if is_dequantize(arg) and v.dtype == "int8":
            out = ctx.builder.add_tensor(v.stored_shape, "float32", f"{arg.name}/dequantized")
            ctx.emit("DEQUANTIZE", [v], [out])
            v = Value(out, v.shape, v.perm, "float32", None)
        if (
            v.tensor in ctx.builder.inputs
            or v.tensor in ctx.builder.outputs
            or ctx.builder.tensors[v.tensor].buffer
        ):
            # LiteRT needs a distinct, computed tensor per output: copy through RESHAPE.
            stored = list(v.stored_shape)
            out = ctx.builder.add_tensor(stored, v.dtype, f"{arg.name}/out", quant=v.quant)
            shape_t = ctx.add_constant(np.asarray(stored, np.int32), "int32", "shape")
            ctx.emit("RESHAPE", [v.tensor, shape_t], [out], options("ReshapeOptions", newShape=stored))
            v = Value(out, v.shape, v.perm, v.dtype, v.quant)
        ctx.builder.outputs.append(v.tensor)
        ctx.output_dim_orders.append(wanted)
        names.append(arg.name)
    return names


def _who(op_converter: OpConverter, reg: Registry | None) -> str:
    """``Converter (plugin 'x' (dist version))`` for messages that must name the plugin."""
    return f"{op_converter.name} ({reg.owner_label(op_converter)})" if reg is not None else op_converter.name


def select_converter(
    node: Node, candidates: Sequence[OpConverter], target: TargetSpec, reg: Registry | None = None
) -> tuple[OpConverter | None, Support]:
    """The first candidate (highest priority first) that accepts ``node``; else the reasons.

    A support check that raises is a plugin bug: with a strict registry it is an error
    naming the plugin; otherwise the node is refused with the plugin and exception as reason.
    """
    reasons = []
    for op_converter in candidates:
        try:
            s = op_converter.is_supported(node, target)
            if not isinstance(s, Support):
                raise TypeError(f"returned {type(s).__name__}, expected Support")
        except Exception as exc:
            why = f"{_who(op_converter, reg)}: support check raised {type(exc).__name__}: {exc}"
            if reg is not None and reg.strict:
                raise PluginError(f"{why} (node {node.name}, {node_op(node)}; --strict)") from exc
            s = Support(False, why)
        if s.ok:
            return op_converter, s
        reasons.append(f"{op_converter.name}: {s.reason}" if len(candidates) > 1 else s.reason)
    if not candidates:
        return None, Support(False, "no converter plugin handles this op")
    return None, Support(False, "; ".join(reasons))


def convert_program(
    ep: ExportedProgram,
    target: TargetSpec,
    converters: dict[str, list[OpConverter]],
    name: str = "partition",
    reg: Registry | None = None,
) -> Converted:
    """Convert a whole (partition) program; every compute node must be accepted by a converter.

    A node the partitioner already placed is converted by the converter it chose (no second
    support check); ``reg`` names the plugins in messages and carries ``--strict``.
    """
    start = time.perf_counter()
    ctx = ConversionContext(ep, target, name, converters)
    mark_constants(ep, ctx._folds)
    mark_moved_codes(ep.graph_module.graph, moving_ops(c for cs in converters.values() for c in cs))
    graph = ep.graph_module.graph
    output_names: list[str] = []
    input_names: list[str] = []
    for node in graph.nodes:
        ctx.current, ctx._group = node, []
        if node.op == "placeholder":
            if not ctx.is_constant(node):
                add_graph_input(ctx, node)
                input_names.append(node.name)
        elif node.op == "output":
            output_names = add_graph_outputs(ctx, list(node.args[0]))
        elif node.op == "get_attr":
            continue
        elif node.op == "call_function":
            if node in ctx.absorbed or node in ctx.values or ctx.is_constant(node):
                continue
            if is_dequantize(node):
                convert_dequantize(ctx, node)
            elif is_quantize(node):
                convert_quantize(ctx, node)
            elif node.target is operator.getitem:
                raise ConversionError(
                    node, "getitem", f"output {node.args[1]} of {node.args[0]} was not produced"
                )
            else:
                op = node_op(node)
                candidates = converters.get(op, [])
                op_converter = decided_converter(node, candidates, reg)
                if op_converter is None:
                    op_converter, support = select_converter(node, candidates, target, reg)
                    if op_converter is None:
                        raise ConversionError(node, op, support.reason)
                try:
                    op_converter.convert(node, ctx)
                except ConversionError as exc:
                    exc.args = (f"{exc} (converter {_who(op_converter, reg)})",)
                    raise
                except Exception as exc:
                    raise ConversionError(
                        node, op, f"{_who(op_converter, reg)} failed: {type(exc).__name__}: {exc}"
                    ) from exc
                if node not in ctx.values and not any(u in ctx.values for u in node.users):
                    raise ConversionError(
                        node, op, f"{_who(op_converter, reg)}: convert() produced no output value"
                    )
        else:
            raise ConversionError(node, node.op, "unsupported graph node kind")
    ctx.builder.metadata["etforge_int8_values"] = json.dumps(
        # (a flatten kept in channels-last column order is not the logical tensor: left out)
        {k: [v.tensor, list(v.perm)] for k, v in ctx.int8_values.items() if v.columns is None},
        sort_keys=True,
    ).encode()
    floats = {k: [v.tensor, list(v.perm)] for k, v in ctx.float_values.items() if v.columns is None}
    if floats:  # float partitions only: int8 partitions' bytes stay as they were
        ctx.builder.metadata["etforge_float_values"] = json.dumps(floats, sort_keys=True).encode()
    tflite = ctx.builder.finish(ctx.debug_map)
    ops = [ctx.builder.opcodes[o.opcodeIndex].builtinCode for o in ctx.builder.operators]
    names = {v: k for k, v in vars(_schema_ops()).items() if k.isupper()}
    return Converted(
        tflite=tflite,
        debug_map=ctx.debug_map,
        op_nodes=ctx.op_nodes,
        operators=[names.get(c, str(c)) for c in ops],
        input_names=input_names,
        output_names=output_names,
        input_dim_orders=ctx.input_dim_orders,
        output_dim_orders=ctx.output_dim_orders,
        seconds=time.perf_counter() - start,
    )


def _schema_ops() -> Any:
    from ai_edge_litert import schema_py_generated as schema

    return schema.BuiltinOperator


__all__ = ["Converted", "convert_program", "select_converter"]
