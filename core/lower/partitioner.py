"""The NPU partitioner: asks op-converter plugins, through the target, which nodes the NPU takes.

Quantize/dequantize nodes around an accepted op join its partition, so partitions have
int8 boundaries; grouping is ExecuTorch/torch.fx's cycle-free capability partitioner.
Every decision, refusals included, is kept with its reason for the report.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import torch
from executorch.exir.backend.compile_spec_schema import CompileSpec
from executorch.exir.backend.partitioner import DelegationSpec, Partitioner, PartitionResult
from executorch.exir.backend.utils import tag_constant_data
from torch.export import ExportedProgram
from torch.fx import Node
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from etforge.core.contracts.converter import OpConverter, Support, folding, moving_ops
from etforge.core.contracts.target import TargetSpec
from etforge.core.graph.utils import (
    is_constant,
    is_dequantize,
    is_quantize,
    mark_constants,
    mark_moved_codes,
    node_dtype,
    node_op,
    tensor_inputs,
)
from etforge.core.litert.context import DECIDED_KEY
from etforge.core.litert.convert import select_converter
from etforge.core.lower import npu_backend as _backend  # registers EtforgeNpuBackend
from etforge.core.registry.manager import Registry, registry

_STRUCTURAL = {"operator.getitem"}
#: Node meta key caching a support answer (see ``EtforgePartitioner._select``).
_SUPPORT_KEY = "etforge_support"


@dataclass
class Decision:
    """Where one Edge node goes and who decided."""

    node: str
    op: str
    npu: bool
    converter: str | None
    plugin: str | None
    reason: str
    partition: str | None = None
    macs: int = 0
    handle: int | None = None
    #: The compute nodes (or user inputs) feeding this one, through q/dq and getitem: the
    #: edges of the placement picture (``report --html``).
    inputs: tuple[str, ...] = ()
    #: Output shape, dtype and bytes (the first output of a multi-output node).
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    bytes: int = 0


class _Selected(OperatorSupportBase):
    def __init__(self, nodes: set[Node]) -> None:
        self.nodes = nodes

    def is_node_supported(self, submodules: Any, node: Node) -> bool:
        return node in self.nodes


def _compute_nodes(ep: ExportedProgram) -> list[Node]:
    return [
        n
        for n in ep.graph_module.graph.nodes
        if n.op == "call_function"
        and not is_quantize(n)
        and not is_dequantize(n)
        and node_op(n) not in _STRUCTURAL
    ]


def _producers(node: Node) -> tuple[str, ...]:
    """Names of the compute nodes and user inputs ``node`` reads, seen through q/dq and getitem
    (constants — weights, biases, their dequantize — are not edges)."""
    out: list[str] = []

    def walk(arg: object) -> None:
        if isinstance(arg, (list, tuple)):
            for a in arg:
                walk(a)
            return
        if not isinstance(arg, Node) or is_constant(arg):
            return
        if arg.op == "call_function" and (
            is_quantize(arg) or is_dequantize(arg) or node_op(arg) in _STRUCTURAL
        ):
            walk(arg.args[0] if arg.args else None)
        elif arg.op in ("call_function", "placeholder") and arg.name not in out:
            out.append(arg.name)

    walk(list(node.args))
    return tuple(out)


def _quantized_as(node: Node, depth: int = 3) -> Node | None:
    """The quantize node storing ``node``'s output, followed through a getitem or a fused
    activation of the same shape (op_converter + relu keep one int8 tensor)."""
    users = list(node.users)
    if not users or depth == 0:
        return None
    if all(is_quantize(u) for u in users):
        return users[0]
    if len(users) != 1 or users[0].op != "call_function":
        return None
    user = users[0]
    same = getattr(user.meta.get("val"), "shape", None) == getattr(node.meta.get("val"), "shape", 0)
    return _quantized_as(user, depth - 1) if node_op(user) in _STRUCTURAL or same else None


def _output_facts(node: Node) -> tuple[tuple[int, ...] | None, str | None, int]:
    """Shape, dtype and bytes of the tensor ``node`` hands on: int8 when it is quantized
    (a float op between dequantize and quantize stores its quantized output)."""
    val = node.meta.get("val")
    quantized = _quantized_as(node)
    if quantized is not None:
        val = quantized.meta.get("val")
    if isinstance(val, (list, tuple)) and val:
        val = val[0]
    if not isinstance(val, torch.Tensor):
        return None, None, 0
    try:
        shape = tuple(int(d) for d in val.shape)
    except (TypeError, ValueError):  # symbolic sizes
        return None, str(val.dtype).removeprefix("torch."), 0
    return shape, str(val.dtype).removeprefix("torch."), int(val.numel()) * val.element_size()


class EtforgePartitioner(Partitioner):
    """Tags the nodes the target's NPU takes; one instance per compile."""

    def __init__(
        self,
        target: TargetSpec,
        options: dict[str, Any] | None = None,
        reg: Registry | None = None,
        backend_id: str = "EtforgeNpuBackend",
        lowering: _backend.Lowering | None = None,
    ) -> None:
        self.target = target
        self.options = {**target.option_defaults(), **(options or {})}
        self.registry = lowering.registry if lowering is not None else (reg or registry())
        self.backend_id = backend_id
        spec = [
            CompileSpec("target", target.name.encode()),
            CompileSpec(
                "options",
                json.dumps(target.output_options(self.options), sort_keys=True, default=list).encode(),
            ),
        ]
        self.delegation_spec = DelegationSpec(backend_id, spec)
        self.decisions: list[Decision] = []
        self._chosen: dict[Node, Decision] = {}
        #: Keep converter-preferred ATen ops whole (see ops_to_not_decompose).
        self.preserve = True
        self.seconds = 0.0  # time spent deciding and tagging (for the benchmarks)
        self._table = self.registry.converters_for(target)
        self._moves = moving_ops(c for cs in self._table.values() for c in cs)
        #: Ops a converter computes at compile time from a constant (of every converter, NPU or
        #: not: a folded weight is no CPU node's input either).
        self._folds = frozenset(folding(self.registry.converters))
        #: Real values of the program's parameters and buffers by state-dict key: ExecuTorch
        #: hands ``partition`` a copy whose state dict holds fake tensors (no data), and a
        #: no-op check (x + 0) needs the value (see :meth:`remember_constants`).
        self._real: dict[str, torch.Tensor] = {}

    def remember_constants(self, ep: ExportedProgram) -> None:
        """Keep (references to) ``ep``'s real parameter and buffer values for the checks that
        read constant values; the programs ``partition`` is given share its state-dict keys."""
        from torch._subclasses.fake_tensor import FakeTensor

        for key, value in ep.state_dict.items():
            if isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor):
                self._real[key] = value

    # -- decomposition ------------------------------------------------------------------------
    def preserved_op_names(self) -> list[str]:
        """ATen ops the target's converters ask to keep whole."""
        return sorted({p for convs in self._table.values() for c in convs for p in c.preserve})

    def ops_to_not_decompose(self, ep: ExportedProgram) -> tuple[list[torch._ops.OpOverload], Any]:
        """Keep whole the ATen ops a converter asked for (e.g. linear) when it accepts every node.

        All-or-nothing per op lets ExecuTorch take its fast path (no per-node filter, one
        decomposition); an op with any refused node is decomposed everywhere, and the
        converters of its decomposed form (addmm, permute ...) still take the rest.
        """
        mark_constants(ep, self._folds)
        self.remember_constants(ep)
        blocked = set(self.options.get("operators_not_to_delegate", ()))
        if self.target.npu is None:
            return [], None
        if not self.preserve:
            return [], None
        nodes_by_op: dict[str, list[Node]] = {}
        for node in ep.graph_module.graph.nodes:
            if node.op == "call_function":
                nodes_by_op.setdefault(node_op(node), []).append(node)
        ops = []
        for name in self.preserved_op_names():
            nodes = nodes_by_op.get(name, [])
            convs = [c for cs in self._table.values() for c in cs if name in c.preserve]
            if not nodes or name in blocked:
                continue
            if all(self._select(n, convs)[0] for n in nodes):
                ns, op, overload = name.split(".")
                packet = getattr(getattr(torch.ops, ns), op, None)
                if packet is not None and hasattr(packet, overload):
                    ops.append(getattr(packet, overload))
        return ops, None

    # -- partitioning -------------------------------------------------------------------------
    def decide(self, ep: ExportedProgram) -> set[Node]:
        """Pick the NPU nodes; record a Decision (with reason) for every compute node."""
        self.decisions = []
        mark_constants(ep, self._folds)
        mark_moved_codes(ep.graph_module.graph, self._moves)
        blocked = set(self.options.get("operators_not_to_delegate", ()))
        chosen: dict[Node, Decision] = {}
        for node in _compute_nodes(ep):
            op = node_op(node)
            node.meta.pop(DECIDED_KEY, None)
            if self.target.npu is None:
                d = Decision(node.name, op, False, None, None, f"target {self.target.name} has no NPU")
            elif op in blocked:
                d = Decision(node.name, op, False, None, None, "listed in operators_not_to_delegate")
            else:
                op_converter, support = self._select(node, self._table.get(op, []))
                owner = self.registry.owner(op_converter) if op_converter else None
                d = Decision(
                    node.name,
                    op,
                    op_converter is not None,
                    op_converter.name if op_converter else None,
                    owner,
                    support.reason,
                )
                if op_converter is not None:  # decided once: conversion uses this converter as is
                    node.meta[DECIDED_KEY] = (owner, op_converter.name)
            d.macs = self._macs(node)
            d.handle = node.meta.get("debug_handle")
            d.inputs = _producers(node)
            d.shape, d.dtype, d.bytes = _output_facts(node)
            self.decisions.append(d)
            if d.npu:
                chosen[node] = d
        _drop_unquantized_boundaries(chosen)
        self._chosen = chosen  # for _partition, which may refuse more of them
        return set(chosen)

    def _select(self, node: Node, candidates: list[OpConverter]) -> tuple[OpConverter | None, Support]:
        """``select_converter``, asked once per node: ExecuTorch asks which ops to keep whole
        more than once, on copies of the graph, and the kept node is decided again after
        ``to_edge``; the answer rides in the node's meta (plain data, so copies keep it)."""
        key = (
            id(self.registry),
            self.target.name,
            node_op(node),
            node_dtype(node),
            tuple(c.name for c in candidates),
        )
        cached = node.meta.get(_SUPPORT_KEY)
        if cached is not None and cached[0] == key:
            _, name, reason = cached
            op_converter = next((c for c in candidates if c.name == name), None) if name else None
            if op_converter is not None or name is None:
                return op_converter, Support(op_converter is not None, reason)
        op_converter, support = select_converter(node, candidates, self.target, self.registry)
        node.meta[_SUPPORT_KEY] = (key, op_converter.name if op_converter else None, support.reason)
        return op_converter, support

    def _macs(self, node: Node) -> int:
        """MACs counted by any converter of the op (also for nodes the NPU refuses)."""
        for op_converter in self.registry.converters:
            if node_op(node) in op_converter.ops:
                try:
                    return int(op_converter.macs(node))
                except Exception as e:  # a plugin's bug: 0 MACs, said (strict: an error)
                    from etforge.core.common import fallbacks

                    fallbacks.record(
                        "partition",
                        "counted 0 MACs",
                        f"{node.name} ({node_op(node)})",
                        f"{op_converter.name}.macs of {self.registry.owner_label(op_converter)} failed: {type(e).__name__}: {e}",
                    )
                    return 0
        return 0

    def partition(self, exported_program: ExportedProgram) -> PartitionResult:
        start = time.perf_counter()
        try:
            return self._partition(exported_program)
        finally:
            self.seconds += time.perf_counter() - start

    def _partition(self, exported_program: ExportedProgram) -> PartitionResult:
        ep = exported_program
        self.remember_constants(ep)  # a real program (tests, direct calls) is its own source
        self.decide(ep)
        chosen = self._chosen
        by_name = {d.node: d for d in self.decisions}
        groups = self._partition_checks(ep, chosen)
        min_ops = int(self.options.get("min_partition_ops", 1))
        tags: dict[str, DelegationSpec] = {}
        groups = sorted(groups, key=lambda p: min(_order(ep, n) for n in p.nodes))
        for group in groups:
            compute = [
                n for n in group.nodes if n in chosen and not is_constant(n)
            ]  # folded weights don't count
            refusal = ""
            if len(compute) < min_ops:
                refusal = f"partition of {len(compute)} op(s) < min_partition_ops={min_ops}"
            if refusal:
                for n in (n for n in group.nodes if n in chosen):
                    by_name[n.name].npu = False
                    by_name[n.name].reason = refusal
                continue
            tag = f"etforge_{len(tags)}"
            for n in group.nodes:
                n.meta["delegation_tag"] = tag
                if n.name in by_name:
                    by_name[n.name].partition = tag
            # The tag travels to preprocess, which names the partition after it.
            tags[tag] = DelegationSpec(
                self.backend_id,
                [*self.delegation_spec.compile_specs, CompileSpec(_backend.PARTITION_KEY, tag.encode())],
            )
        tag_constant_data(ep)
        return PartitionResult(tagged_exported_program=ep, partition_tags=tags)

    def _partition_checks(self, ep: ExportedProgram, chosen: dict[Node, Decision]) -> list[Any]:
        """Group the chosen nodes, ask the target's partition checks (plugins) about the
        proposal, take the nodes they refuse off the NPU and group again, until none is
        refused (at most once per node). Returns the final groups."""
        from etforge.core.common.errors import EtforgeError
        from etforge.core.contracts.partition_check import ProposedPartition

        groups = self._groups(ep, chosen)
        checks = [c for c in self.registry.partition_checks if c.applies_to(self.target)]
        for _ in range(len(chosen) + 1):
            if not checks or not chosen:
                break
            proposed = [
                ProposedPartition(
                    frozenset(g.nodes),
                    tuple(sorted((n for n in g.nodes if n in chosen), key=lambda n: _order(ep, n))),
                    lambda n: self._is_noop(ep, n),
                )
                for g in sorted(groups, key=lambda g: min(_order(ep, n) for n in g.nodes))
            ]
            refused: dict[Node, str] = {}
            for check in checks:
                try:
                    answer = check.refuse(proposed, self.target)
                except EtforgeError:
                    raise
                except Exception as e:
                    raise EtforgeError(
                        f"partition check {check.name} of {self.registry.owner_label(check)} failed: "
                        f"{type(e).__name__}: {e}"
                    ) from e
                for node, why in answer.items():
                    if node in chosen:
                        refused.setdefault(node, why)
            if not refused:
                break
            for node, why in refused.items():
                d = chosen.pop(node)
                d.npu, d.reason = False, why
            _drop_unquantized_boundaries(chosen)
            groups = self._groups(ep, chosen)
        return groups

    def _is_noop(self, ep: ExportedProgram, node: Node) -> bool:
        """Whether the converter that took ``node`` says it computes nothing on the target."""
        from torch._subclasses.fake_tensor import FakeTensor

        from etforge.core.litert.context import constant_value

        who = node.meta.get(DECIDED_KEY)
        op_converter = next((c for c in self._table.get(node_op(node), []) if who and c.name == who[1]), None)
        if op_converter is None:
            return False

        def constant(n: Node) -> torch.Tensor | None:
            if not isinstance(n, Node) or n.op != "placeholder":
                return None
            value = constant_value(ep, n)
            if isinstance(value, FakeTensor):  # ExecuTorch's fake copy: the real value, if known
                key = ep.graph_signature.inputs_to_parameters.get(str(n.target))
                key = key or ep.graph_signature.inputs_to_buffers.get(str(n.target))
                value = self._real.get(key) if key else None
                if value is not None and isinstance(value, FakeTensor):
                    value = None
            return value

        try:
            return bool(op_converter.is_noop(node, self.target, constant))
        except Exception as e:  # a plugin bug must not pass for a no-op
            from etforge.core.common.errors import EtforgeError

            raise EtforgeError(
                f"{op_converter.name}.is_noop failed on node {node.name} ({node_op(node)}): {e}"
            ) from e

    def _groups(self, ep: ExportedProgram, chosen: dict[Node, Decision]) -> list[Any]:
        """The chosen nodes with their Q/DQ, grouped into cycle-free partitions."""
        nodes = set(chosen)
        for node in chosen:
            for a in node.all_input_nodes:
                if is_dequantize(a):
                    nodes.add(a)
            for u in node.users:
                if is_quantize(u) or node_op(u) in _STRUCTURAL:
                    nodes.add(u)
                    nodes.update(x for x in u.users if is_quantize(x))
        # A requantization between NPU ops (dequantize -> quantize to other qparams, e.g. a
        # softmax output feeding a zero-point-0 bmm input) is a QUANTIZE inside the partition.
        for dq in [n for n in ep.graph_module.graph.nodes if is_dequantize(n) and n not in nodes]:
            qs = list(dq.users)
            if (
                dq.args[0] in nodes
                and is_quantize(dq.args[0])
                and qs
                and all(is_quantize(q) and q.users and all(u in nodes for u in q.users) for q in qs)
            ):
                nodes.add(dq)
                nodes.update(qs)
        return CapabilityBasedPartitioner(
            ep.graph_module, _Selected(nodes), allows_single_node_partition=True
        ).propose_partitions()


def _drop_unquantized_boundaries(chosen: dict[Node, Decision]) -> None:
    """An int8 op needs int8 inputs: each tensor input must be a DQ or another NPU node
    (e.g. an activation fused into its delegated producer). Drop until stable."""
    changed = True
    while changed:
        changed = False
        for node in list(chosen):
            if node_dtype(node) != "int8":
                continue
            why = _int8_boundary_problem(node, chosen)
            if why:
                d = chosen.pop(node)
                d.npu, d.reason = False, why
                changed = True


def _int8_boundary_problem(node: Node, chosen: dict[Node, Decision]) -> str:
    """Why an int8 NPU node would have a float value at the partition boundary ("" if none)."""
    for a in tensor_inputs(node):
        if (
            a.op == "call_function"
            and not is_dequantize(a)
            and a not in chosen
            and node_op(a) not in _STRUCTURAL
        ):
            return f"input {a.name} is not quantized and stays off the NPU"
    for u in node.users:
        targets = list(u.users) if node_op(u) in _STRUCTURAL else [u]
        for t in targets:
            if not is_quantize(t) and t not in chosen:
                return f"output feeds {t.name}, which stays off the NPU, without being quantized"
    return ""


def _order(ep: ExportedProgram, node: Node) -> int:
    cache = ep.graph_module.meta.setdefault("_etforge_order", {})
    if not cache:
        for i, n in enumerate(ep.graph_module.graph.nodes):
            cache[n] = i
    return cache[node]
