"""The float check on the compiled program's own NPU partitions: no second lowering.

The float check runs each NPU converter on float32 tensors and compares every op's value with
its float Edge op on the same inputs (``runtime.verification.float_check``). It used to get
float partitions by lowering ``float.pt2`` a second time (BatchNorms folded, partitioned,
delegated: most of its time). The rebuilt int8 program already holds each NPU partition's
Edge program: the ops the device runs, each between a dequantize and a quantize. Removed,
those pairs leave the same ops in float — the int8 constants dequantized (the values the
device's weights stand for), each partition input dequantized from the int8 value the program
handed the partition on a seeded sample — which the same converters convert in float (the
converter the partitioner chose for each op; one that handles int8 only is not asked to
convert float: the op's converter is chosen again for float32 tensors). The
comparison and its tolerance (``FLOAT_REL_TOL``) are unchanged; the ops checked are exactly
those the device runs on the NPU. A partition this cannot strip or convert (a quantize or
dequantize that is not one of these pairs, a converter refusing a float op) is not
approximated: ``float_ops`` returns None and the float check lowers ``float.pt2`` as before.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from etforge.core.graph.utils import clone_program, is_dequantize, is_quantize, node_op
from etforge.core.litert.context import DECIDED_KEY, decided_converter


class NotStrippable(Exception):
    """The partition has a quantize / dequantize that is not a removable pair."""


@dataclass(frozen=True)
class FloatPartition:
    """One NPU partition in float: its program, its float LiteRT payload, and per user input
    the dequantize that turns the delegate's int8 argument into its float input (None: as is)."""

    program: ExportedProgram
    processed_bytes: bytes
    dequantize: tuple[Any, ...]

    @property
    def original_module(self) -> ExportedProgram:  # what float_op_check reads, as on a delegate
        return self.program

    def inputs(self, args: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return [a if dq is None else dq[0](a, *dq[1]) for a, dq in zip(args, self.dequantize, strict=True)]


def stripped(ep: ExportedProgram) -> tuple[ExportedProgram, tuple[Any, ...]]:
    """A copy of ``ep`` with every quantize / dequantize pair removed and its int8 constants
    dequantized, and per user input how to dequantize it (raises NotStrippable)."""
    ep = clone_program(ep)
    graph = ep.graph
    specs = {s.arg.name: s for s in ep.graph_signature.input_specs if hasattr(s.arg, "name")}
    fake_mode = next(
        (
            v.fake_mode
            for n in graph.nodes
            if isinstance(v := n.meta.get("val"), torch.Tensor) and hasattr(v, "fake_mode")
        ),
        None,
    )
    if fake_mode is None:
        raise NotStrippable("no fake values to retype the inputs with")
    user_dq: dict[str, Any] = {}
    seen: set[str] = set()  # placeholders dequantized in place already

    def value(arg: Any) -> Any:
        if isinstance(arg, torch.fx.Node):
            spec = specs.get(arg.name)
            if arg.op != "placeholder" or spec is None or spec.kind == InputKind.USER_INPUT:
                raise NotStrippable(f"{arg.name}: a quantization parameter that is not a constant")
            return ep.state_dict[spec.target] if spec.target in ep.state_dict else ep.constants[spec.target]
        return arg

    def retype(node: torch.fx.Node, like: torch.Tensor) -> None:
        # made in the fake mode, static (a symbol per dimension cost ~10 ms each), not converted
        # from a real tensor: that conversion imports Dynamo whole (``deferred_dynamo``)
        with fake_mode:
            node.meta["val"] = torch.empty_strided(like.shape, like.stride(), dtype=torch.float32)

    for dq in [n for n in graph.nodes if is_dequantize(n)]:
        src = dq.args[0]
        if not isinstance(src, torch.fx.Node):
            raise NotStrippable(f"{dq.name} dequantizes a constant argument")
        if is_quantize(src):
            dq.replace_all_uses_with(src.args[0])
        elif src.op == "placeholder" and src.name in specs:
            spec = specs[src.name]
            if src.name not in seen:  # every reader one dequantize of the same parameters
                if any(not is_dequantize(u) or u.args[1:] != dq.args[1:] for u in src.users):
                    raise NotStrippable(f"{src.name} is read other than by dequantizes of one scale")
                seen.add(src.name)
                args = tuple(value(a) for a in dq.args[1:])
                if spec.kind == InputKind.USER_INPUT:
                    user_dq[src.name] = (dq.target, args)
                else:
                    held = ep.state_dict if spec.target in ep.state_dict else ep.constants
                    held[spec.target] = dq.target(held[spec.target], *args)
                retype(src, src.meta["val"])
            dq.replace_all_uses_with(src)
        else:
            raise NotStrippable(f"{dq.name} dequantizes {src.name}, neither a quantize nor an input")
        graph.erase_node(dq)
    output = graph.output_node()
    for q in [n for n in graph.nodes if is_quantize(n)]:
        if any(u is not output for u in q.users):
            raise NotStrippable(f"{q.name} feeds something other than a dequantize or the output")
        q.replace_all_uses_with(q.args[0])
        graph.erase_node(q)
    names = [a.name if isinstance(a, torch.fx.Node) else None for a in output.args[0]]
    if len(names) != len(ep.graph_signature.output_specs) or None in names:
        raise NotStrippable("an output is not a node")
    for spec, name in zip(ep.graph_signature.output_specs, names, strict=True):
        spec.arg = dataclasses.replace(spec.arg, name=name)  # the signature is the copy's own
    ep.graph_module.recompile()
    inputs = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    return ep, tuple(user_dq.get(name) for name in inputs)


def float_partition(lowered: Any, target: Any, reg: Any) -> FloatPartition:
    """``lowered`` (a delegate of the rebuilt program) in float, converted by ``target``'s
    converters in float (raises NotStrippable, or the converter's error)."""
    from etforge.core.litert import payload
    from etforge.core.litert.convert import convert_program

    blob = payload.unpack_for_host(bytes(lowered.processed_bytes))
    program, dequantize = stripped(lowered.original_module)
    converters = reg.converters_for(target)
    for node in program.graph.nodes:  # the partitioner's choice, unless it takes int8 only
        chosen = decided_converter(node, converters.get(node_op(node), []), reg)
        if chosen is not None and "float32" not in chosen.dtypes:
            node.meta.pop(DECIDED_KEY)  # chosen again for float32, as the float lowering would
    # Conversion marks nodes' metadata only (the compile converts the very program it keeps as
    # the delegate's original_module, which verify runs as the op reference): ``program`` is
    # this call's own copy (``stripped``), so it is converted without a second copy.
    converted = convert_program(program, target, converters, name=blob.partition, reg=reg)
    packed = payload.pack(
        payload.FORMAT_LITERT_HOST,
        blob.partition,
        True,
        converted.tflite,
        input_dim_orders=[list(d) for d in converted.input_dim_orders],
        output_dim_orders=[list(d) for d in converted.output_dim_orders],
    )
    return FloatPartition(program, packed, dequantize)
