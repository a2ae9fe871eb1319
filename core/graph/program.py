"""An ATen graph module (PT2E's converted graph, a rewritten float graph) as an ``ExportedProgram``, without re-tracing it.

``convert_pt2e`` returns an unlifted ``GraphModule`` that is already an ATen graph; the usual
next step, ``torch.export.export`` of it, traces every node again through FakeTensor,
proxy and functionalization modes (about half of the quantize stage) only to lift its
parameters and buffers into placeholders and to recompute the nodes' fake values. Here both
are done directly, with ``torch.export``'s own conventions, so the program is the one the
re-export gives: parameters, then buffers, then user inputs; placeholders named ``p_``/``b_``
plus the attribute path; call nodes named after their operator; every value from one
FakeTensorMode. Anything outside that shape (submodule calls, higher-order ops, attributes
that are neither parameters nor buffers, non-tensor outputs) raises :class:`Unsupported`, and
the caller re-exports. The rewrite stage (``core/front/rewrites.py``) builds its rewritten float
program the same way.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    TensorArgument,
)
from torch.fx import Graph, GraphModule, Node
from torch.fx.experimental.proxy_tensor import snapshot_fake
from torch.fx.passes.fake_tensor_prop import FakeTensorProp

#: Meta the re-export does not carry over (values are recomputed; annotations are PT2E's).
_DROPPED_META = frozenset({"val", "tensor_meta", "quantization_annotation"})


class Unsupported(Exception):
    """The graph has something this direct construction does not handle."""


def _kept_meta(node: Node) -> dict[str, Any]:
    return {k: v for k, v in node.meta.items() if k not in _DROPPED_META}


def _placeholder_name(prefix: str, fqn: str) -> str:
    """A valid identifier: module names may hold any character (torchvision's ``block1-0``)."""
    import re

    return prefix + re.sub(r"\W", "_", fqn)


def _non_persistent(gm: GraphModule) -> set[str]:
    out: set[str] = set()
    for prefix, module in gm.named_modules():
        for name in module._non_persistent_buffers_set:
            out.add(f"{prefix}.{name}" if prefix else name)
    return out


def program_from_graph(
    gm: GraphModule, reference: ExportedProgram, example: Sequence[torch.Tensor]
) -> ExportedProgram:
    """``gm`` (PT2E-converted, from ``reference.module()``) as an ``ExportedProgram``."""
    _check_plain(gm, reference, example)
    params = dict(gm.named_parameters())
    buffers = dict(gm.named_buffers())
    non_persistent = _non_persistent(gm)
    lifted = {**params, **buffers}

    graph = Graph()
    env: dict[Node, Node] = {}
    holders, specs = _lifted_placeholders(graph, params, buffers, non_persistent)
    for node in gm.graph.find_nodes(op="placeholder"):
        env[node] = _placeholder(graph, node.name)
        env[node].meta = _kept_meta(node)
        specs.append(InputSpec(InputKind.USER_INPUT, TensorArgument(env[node].name), None))
    outputs: list[OutputSpec] = []
    for node in gm.graph.nodes:
        if node.op == "output":
            outputs = _copy_output(graph, node, env)
        elif node.op != "placeholder":
            env[node] = _copy_node(graph, node, env, holders)

    module = GraphModule(torch.nn.Module(), graph)
    _propagate_meta(module, [lifted[fqn] for fqn in holders], example)
    state_dict = {fqn: lifted[fqn] for fqn in holders if fqn not in non_persistent}
    constants = {fqn: lifted[fqn] for fqn in holders if fqn in non_persistent}
    return ExportedProgram(
        root=module,
        graph=graph,
        graph_signature=ExportGraphSignature(input_specs=specs, output_specs=outputs),
        state_dict=state_dict,
        range_constraints={},
        module_call_graph=copy.deepcopy(reference.module_call_graph[:1]),
        example_inputs=(tuple(example), {}),
        constants=constants,
    )


def _placeholder(graph: Graph, name: str) -> Node:
    """A placeholder whose target is its name, as ``torch.export`` makes them: fx snake-cases
    the name (``p_Conv2d_1a_weight`` becomes ``p_conv2d_1a_weight``) but not the target, and
    passes that look placeholders up by target (ExecuTorch's) must find the spec's name."""
    node = graph.placeholder(name)
    node.target = node.name
    return node


def _lifted_placeholders(
    graph: Graph, params: dict[str, torch.Tensor], buffers: dict[str, torch.Tensor], non_persistent: set[str]
) -> tuple[dict[str, Node], list[InputSpec]]:
    """A placeholder per parameter, then per buffer, as ``torch.export`` lifts them (by fqn)."""
    holders: dict[str, Node] = {}
    specs: list[InputSpec] = []
    for fqn in params:
        holders[fqn] = _placeholder(graph, _placeholder_name("p_", fqn))
        specs.append(InputSpec(InputKind.PARAMETER, TensorArgument(holders[fqn].name), fqn))
    for fqn in buffers:
        holders[fqn] = _placeholder(graph, _placeholder_name("b_", fqn))
        specs.append(
            InputSpec(
                InputKind.BUFFER, TensorArgument(holders[fqn].name), fqn, persistent=fqn not in non_persistent
            )
        )
    return holders, specs


def _copy_node(graph: Graph, node: Node, env: dict[Node, Node], holders: dict[str, Node]) -> Node:
    """``node`` of the converted graph in the new one: a get_attr becomes its lifted placeholder,
    a functional operator a call with its arguments as the dispatcher hands them on."""
    if node.op == "get_attr":
        # A get_attr names its attribute's path: the fqn, every tensor having one (_check_plain).
        if str(node.target) not in holders:
            raise Unsupported(f"attribute {node.target!r} is neither a parameter nor a buffer")
        return holders[str(node.target)]
    if node.op == "call_function" and node.target is operator.getitem:
        new = graph.create_node(
            "call_function", operator.getitem, torch.fx.map_arg(node.args, env.__getitem__)
        )
        new.meta = _kept_meta(node)
        return new
    if node.op == "call_function":
        if not isinstance(node.target, torch._ops.OpOverload) or node.target._schema.is_mutable:
            raise Unsupported(f"{node.name} calls {node.target!r}, not a functional operator")
        args, kwargs = as_dispatched(
            node.target,
            torch.fx.map_arg(node.args, env.__getitem__),
            torch.fx.map_arg(node.kwargs, env.__getitem__),
        )
        new = graph.create_node(
            "call_function",
            node.target,
            args,
            kwargs,
            name=graph._target_to_str(node.target.overloadpacket.__name__),
        )
        new.meta = _kept_meta(node)
        new.meta["original_aten"] = node.target  # a re-trace records the op it traced
        return new
    raise Unsupported(f"{node.name} is a {node.op} node")


def _copy_output(graph: Graph, node: Node, env: dict[Node, Node]) -> list[OutputSpec]:
    """The output node (every output a tensor of the graph) and its specs."""
    results = torch.fx.map_arg(node.args[0], env.__getitem__)
    flat = results if isinstance(results, (list, tuple)) else (results,)
    if not all(isinstance(r, Node) for r in flat):
        raise Unsupported("an output is not a tensor of the graph")
    graph.output(tuple(flat))
    return [OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(r.name), None) for r in flat]


def _propagate_meta(
    module: GraphModule, holder_values: list[torch.Tensor], example: Sequence[torch.Tensor]
) -> None:
    """Every node's ``val`` (fake tensors) and ``tensor_meta``, as ``torch.export`` records them."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.shape_prop import _extract_tensor_metadata

    graph = module.graph
    mode = FakeTensorMode(allow_non_fake_inputs=False)
    fakes = [mode.from_tensor(t, static_shapes=True) for t in (*holder_values, *example)]
    _QdqProp(module, mode).propagate_dont_convert_inputs(*fakes)
    for holder, fake in zip(graph.find_nodes(op="placeholder"), fakes, strict=True):
        holder.meta["val"] = fake  # not the detached snapshot: a parameter keeps requires_grad
    graph.output_node().meta.pop("val", None)  # as torch.export leaves it
    for node in graph.nodes:
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            node.meta["tensor_meta"] = _extract_tensor_metadata(val)


def _qdq_dtype(node: Node, args: Sequence[Any], kwargs: dict[str, Any]) -> torch.dtype | None:
    """The output dtype of a quantize / dequantize node on a float32 / integer input, by the
    ops' own meta rule (``torch/ao/quantization/fx/_decomposed.py``: ``empty_like`` of the
    input in that dtype); None for anything else."""
    name = getattr(node.target, "__name__", "")
    if getattr(node.target, "namespace", "") != "quantized_decomposed" or not name.endswith(".default"):
        return None
    x = args[0] if args else None
    if not isinstance(x, torch.Tensor):
        return None
    if name in ("quantize_per_tensor.default", "quantize_per_channel.default"):
        return args[-1] if x.dtype == torch.float32 and isinstance(args[-1], torch.dtype) else None
    if name in ("dequantize_per_tensor.default", "dequantize_per_channel.default"):
        return (kwargs.get("out_dtype") or torch.float32) if not x.is_floating_point() else None
    return None


class _QdqProp(FakeTensorProp):
    """``FakeTensorProp`` that gives quantize / dequantize nodes their value by the ops' meta
    rule directly: a fake dispatch of one costs ~1 ms, and a quantized graph holds hundreds."""

    def run_node(self, n: Node) -> Any:
        if n.op != "call_function":
            return super().run_node(n)
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        dtype = _qdq_dtype(n, args, kwargs)
        if dtype is None:
            return super().run_node(n)
        result = torch.empty_like(args[0], dtype=dtype)  # under the propagation's fake mode
        n.meta["val"] = snapshot_fake(result)
        return result


def _as_type(value: Any, kind: Any) -> Any:
    """``value`` as the dispatcher hands it on for a schema argument of type ``kind``."""
    if isinstance(kind, torch.OptionalType):
        return value if value is None else _as_type(value, kind.getElementType())
    if isinstance(kind, torch.BoolType) and type(value) is int:
        return bool(value)
    if isinstance(kind, torch.FloatType) and type(value) in (int, bool):
        return float(value)
    if isinstance(kind, torch.ListType) and isinstance(value, (list, tuple)):
        return [_as_type(v, kind.getElementType()) for v in value]
    return value


def _is_default(arg: Any, value: Any) -> bool:
    if not arg.has_default_value() or isinstance(value, Node):
        return False
    default = arg.default_value
    return type(value) is type(default) and value == default


def as_dispatched(
    op: torch._ops.OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``op``'s arguments as a re-trace records them: converted to the schema's types, the
    positional ones positional, trailing defaults and kwarg-only defaults left out (what the
    dispatcher's boxing gives ``__torch_dispatch__``)."""
    schema = op._schema.arguments
    values: list[tuple[Any, Any]] = []
    for i, arg in enumerate(schema):
        if i < len(args) and not arg.kwarg_only:
            values.append((arg, _as_type(args[i], arg.type)))
        elif arg.name in kwargs:
            values.append((arg, _as_type(kwargs[arg.name], arg.type)))
        elif arg.has_default_value():
            values.append((arg, arg.default_value))
        else:
            raise Unsupported(f"{op} called without its argument {arg.name!r}")
    unknown = set(kwargs) - {a.name for a in schema}
    if unknown or len(args) > sum(not a.kwarg_only for a in schema):
        raise Unsupported(f"{op} called with arguments its schema does not have")
    positional = [(a, v) for a, v in values if not a.kwarg_only]
    while positional and _is_default(*positional[-1]):
        positional.pop()
    kw = {a.name: v for a, v in values if a.kwarg_only and not _is_default(a, v)}
    return tuple(v for _, v in positional), kw


def _check_plain(gm: GraphModule, reference: ExportedProgram, example: Sequence[torch.Tensor]) -> None:
    """What the construction assumes: tensor inputs and outputs only, no mutated inputs,
    every parameter and buffer a distinct tensor. (A constant of the float program is fine
    when PT2E folded it; one left as a plain attribute is refused at its ``get_attr``.)"""
    sig = reference.graph_signature
    if any(s.kind is not OutputKind.USER_OUTPUT for s in sig.output_specs):
        raise Unsupported("the program mutates its inputs or buffers")
    if not all(isinstance(e, torch.Tensor) for e in example):
        raise Unsupported("an example input is not a tensor")
    if len(gm.graph.find_nodes(op="placeholder")) != len(example):
        raise Unsupported("the graph's inputs are not the example's")
    tensors = [t for _, t in gm.named_parameters(remove_duplicate=False)]
    tensors += [t for _, t in gm.named_buffers(remove_duplicate=False)]
    if len({id(t) for t in tensors}) != len(tensors):
        raise Unsupported("a tensor is held under two names")
