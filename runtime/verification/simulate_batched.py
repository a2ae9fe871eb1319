"""The device simulation (``runtime.verification.simulate``) of several samples in one graph pass.

``simulate`` walks the quantized program's ~600 nodes once per sample: Python's walk and each
rule's bookkeeping cost more than the integer arithmetic of one sample. Here the samples ride
along the program's own batch axis (every value the per-sample program computes has batch 1:
``N`` samples are its values stacked along axis 0), one walk for all of them, and each value
is bit-identical to the one ``simulate`` computes for that sample alone:

- a torch op runs once on the stacked values only where that is exact by construction: an op
  whose every output element is one correctly rounded operation of its inputs' elements, or a
  move/selection of codes, and that touches no axis-0 (``_EXACT``); every other torch op (a
  convolution's float sums, a transcendental function: their float rounding can depend on the
  batch size) runs once per sample, on that sample's slice, exactly as ``simulate`` runs it;
- a quantize node's device rule (``device_ref``, a CPU library's) runs once on the stacked codes
  where every op it reads is shape-polymorphic along axis 0 (``_AXIS0_FREE``: the rules compute
  in integers, exact whatever the batch size); otherwise, or when the stacked call raises, it
  runs per sample — what ``simulate`` does;
- an unruled value is forced to the program's per sample, as ``simulate`` does.

Values that are not batch-1 tensors stay a list of per-sample values; whatever reads them runs
per sample. ``BatchedSimulation.per_sample`` counts the node runs that went per sample.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import Node

from etforge.core.graph.utils import is_dequantize, is_quantize, node_op
from etforge.runtime.verification.constant_nodes import ConstantNodes
from etforge.runtime.verification.simulate import (
    FORCE_MAX_STEPS,
    NPU,
    Simulation,
    _copies_codes,
)
from etforge.runtime.verification.stepwise import PORTABLE, laid_out_as, library_rule

Seen = dict[str, tuple[torch.Tensor | None, torch.Tensor]]

#: Torch ops whose every output element is a copy or one correctly rounded operation of its
#: inputs' elements (IEEE add, sub, mul, div, comparisons, rounding, the (de)quantize formulas):
#: their value on stacked samples is, element for element, their value on each sample.
_ELEMENTWISE = {
    "quantized_decomposed.quantize_per_tensor.default", "quantized_decomposed.quantize_per_tensor.tensor",
    "quantized_decomposed.dequantize_per_tensor.default", "quantized_decomposed.dequantize_per_tensor.tensor",
    "aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.div.Tensor", "aten.relu.default",
    "aten.relu6.default", "aten.hardtanh.default", "aten.clamp.default", "aten.neg.default",
    "aten.abs.default", "aten.maximum.default", "aten.minimum.default", "aten.clone.default",
    "aten.contiguous.default", "aten.alias.default", "aten._to_copy.default", "aten.round.default",
}  # fmt: skip
#: Per-channel (de)quantizes: elementwise along any channel axis but the batch's.
_PER_CHANNEL = {
    "quantized_decomposed.quantize_per_channel.default",
    "quantized_decomposed.dequantize_per_channel.default",
}
#: Moves whose arguments name no axis-0 size and copy codes exactly.
_MOVES = {"aten.max_pool2d.default", "aten.max_pool2d_with_indices.default", "aten.upsample_nearest2d.vec",
          "aten.pixel_shuffle.default", "aten.pixel_unshuffle.default"}  # fmt: skip
#: Ops (besides the above) that device rules may read which are shape-polymorphic along axis 0
#: given the argument checks in ``_axis0_free``: the rules compute them in integers.
_STRUCTURAL = {
    "aten.conv2d.default", "aten.conv1d.default", "aten.convolution.default", "aten.conv_transpose2d.input",
    "aten.conv_transpose1d.default", "aten.linear.default", "aten.mm.default", "aten.bmm.default",
    "aten.matmul.default", "aten.addmm.default", "aten.avg_pool2d.default", "aten.adaptive_avg_pool2d.default",
    "aten._adaptive_avg_pool2d.default", "aten.sigmoid.default", "aten.tanh.default", "aten.exp.default",
    "aten.log.default", "aten.hardswish.default", "aten.leaky_relu.default", "aten.prelu.default",
    "aten._prelu_kernel.default", "aten.rsqrt.default", "aten.gelu.default", "aten.upsample_bilinear2d.vec",
    "aten.upsample_bilinear2d.default", "aten.silu.default", "aten.relu_.default", "aten.relu6_.default",
    "aten.hardtanh_.default", "aten.add_.Tensor",
}  # fmt: skip
#: Structural ops that read one input-dependent value (the others: weights, bias, constants).
_ONE_DEPENDENT = _STRUCTURAL - {"aten.bmm.default", "aten.matmul.default", "aten.add_.Tensor"}
#: Ops that may read several input-dependent values beside constants.
_TWO_DEPENDENT = {"aten.bmm.default", "aten.matmul.default", "aten.add_.Tensor"}
#: Ops whose dim argument (position, default) must not be axis 0.
_DIM_ARG = {
    "aten.mean.dim": (1, None), "aten.sum.dim_IntList": (1, None), "aten.amax.default": (1, None),
    "aten.amin.default": (1, None), "aten._softmax.default": (1, None), "aten.softmax.int": (1, None),
    "aten.slice.Tensor": (1, 0), "aten.select.int": (1, None), "aten.cat.default": (1, 0),
    "aten.squeeze.dim": (1, None), "aten.squeeze.dims": (1, None), "aten.transpose.int": (1, None),
}  # fmt: skip


@dataclass
class PerSample:
    """A node's value that is not a batch-1 tensor: one value per sample."""

    items: list[Any]


@dataclass
class BatchedSimulation:
    """One ``Simulation`` per sample, and the node runs that went one sample at a time (node ->
    how many times: a torch op, a rule or a forcing that is not exact on stacked samples)."""

    samples: list[Simulation]
    per_sample: dict[str, int] = field(default_factory=dict)
    #: input-dependent nodes computed once for all samples (torch's value or a rule's)
    stacked: int = 0


def _meta(n: Any) -> Any:
    return n.meta.get("val") if isinstance(n, Node) else None


def _batch1(v: Any) -> bool:
    return isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == 1


def _outputs_batch1(n: Node) -> bool:
    v = _meta(n)
    if isinstance(v, (tuple, list)):
        return bool(v) and all(_batch1(x) for x in v)
    return _batch1(v)


def _dims(v: Any) -> list[int]:
    return [int(d) for d in (v if isinstance(v, (list, tuple)) else [v])]


def _axis0_free(n: Node, dep: set[Node]) -> bool:
    """``n`` maps each sample's slice to its own output slice when given stacked values: its
    output and every input-dependent value it reads are batch 1, an elementwise op's other
    operands broadcast along axis 0, and no argument names axis 0."""
    if n.op != "call_function" or not _outputs_batch1(n):
        return False
    op = node_op(n)
    out = _meta(n)
    rank = (out[0] if isinstance(out, (tuple, list)) else out).dim()
    inputs = n.all_input_nodes
    if not all(isinstance(_meta(a), torch.Tensor) for a in inputs):
        return False
    if not all(_batch1(_meta(a)) for a in inputs if a in dep):
        return False
    if op in _ELEMENTWISE or op in _PER_CHANNEL:  # broadcasting: equal ranks, constants batch 1
        for a in inputs:
            m = _meta(a)
            if (a in dep and m.dim() != rank) or (a not in dep and m.dim() >= rank and m.shape[0] != 1):
                return False
    elif op in _ONE_DEPENDENT:  # the weights, bias: constants (a computed weight: per sample)
        first = n.args[1] if op.startswith("aten.addmm") else n.args[0]
        if any(a in dep and a is not first for a in inputs):
            return False
    elif any(a not in dep for a in inputs) and op not in _TWO_DEPENDENT:
        return False  # a constant beside stacked values (cat with a constant): per sample
    first = n.args[1] if op.startswith("aten.addmm") else n.args[0]
    in_rank = _meta(first).dim() if isinstance(first, Node) else rank
    if op in _ELEMENTWISE or op in _MOVES:
        return op != "aten._to_copy.default" or "memory_format" not in n.kwargs
    if op in _PER_CHANNEL:
        return int(n.args[3]) % in_rank != 0
    if op == "aten.permute.default":
        return int(n.args[1][0]) % in_rank == 0
    if op == "aten.flatten.using_ints":
        return int(n.args[1] if len(n.args) > 1 else 0) % in_rank != 0
    if op == "aten.unsqueeze.default":
        return int(n.args[1]) % (in_rank + 1) != 0
    if op in ("aten.constant_pad_nd.default", "aten.pad.default"):
        return len(n.args[1]) <= 2 * (in_rank - 1)
    if op in _DIM_ARG:
        index, default = _DIM_ARG[op]
        dims = n.args[index] if len(n.args) > index else n.kwargs.get("dim", default)
        if op == "aten.cat.default":
            in_rank = rank
        if op == "aten.transpose.int":
            dims = [n.args[1], n.args[2]]
        return dims is not None and len(_dims(dims)) > 0 and all(d % in_rank != 0 for d in _dims(dims))
    return op in _STRUCTURAL


def _exact_stacked(n: Node, dep: set[Node]) -> bool:
    """Torch's value of ``n`` on stacked samples is each sample's (see the module doc)."""
    op = node_op(n) if n.op == "call_function" else ""
    exact = (
        op in _ELEMENTWISE
        or op in _MOVES
        or op in _PER_CHANNEL
        or op in ("aten.permute.default", "aten.flatten.using_ints", "aten.unsqueeze.default")
        or op in ("aten.constant_pad_nd.default", "aten.slice.Tensor", "aten.select.int")
        or op in ("aten.cat.default", "aten.squeeze.dim", "aten.squeeze.dims", "aten.transpose.int")
        or op in ("aten.amax.default", "aten.amin.default")
    )
    return exact and _axis0_free(n, dep)


def _region(q: Node, dep: set[Node]) -> list[Node]:
    """The input-dependent nodes a rule for ``q`` reads: back from its input to the dequantizes."""
    seen: set[Node] = set()
    todo, found = [q.args[0]], []
    while todo:
        a = todo.pop()
        if not isinstance(a, Node) or a in seen or a not in dep:
            continue
        seen.add(a)
        found.append(a)
        if is_dequantize(a) or a.op == "placeholder":
            continue
        todo.extend(a.all_input_nodes)
    return found


def simulate_batched(
    module: torch.fx.GraphModule,
    batches: Sequence[Sequence[torch.Tensor]],
    kinds: Mapping[str, tuple[str, str]] | None = None,
    program_values: Sequence[Mapping[str, torch.Tensor]] | None = None,
    seen: Sequence[Seen] | None = None,
    constants: ConstantNodes | None = None,
) -> BatchedSimulation:
    """``simulate`` of each of ``batches`` (its program values ``program_values[i]``, its
    records into ``seen[i]``), in one pass; ``kinds`` must be every sample's (the host runs
    each op with the same kernel on every sample)."""
    from etforge.runtime.arithmetic.device_ref import Reference
    from etforge.runtime.arithmetic.operands import NotExact

    count = len(batches)
    kinds = kinds or {}
    program_values = program_values or [{} for _ in range(count)]
    not_exact: list[dict[str, str]] = [{} for _ in range(count)]
    unforced: list[dict[str, str]] = [{} for _ in range(count)]
    per_sample: dict[str, int] = {}
    dep: set[Node] = set()
    once = [0]

    def slice_of(v: Any, i: int) -> Any:
        if isinstance(v, PerSample):
            return v.items[i]
        if isinstance(v, torch.Tensor):
            return v[i : i + 1]
        if isinstance(v, (tuple, list)):
            return type(v)(slice_of(x, i) for x in v)
        return v

    def stacked(items: list[Any]) -> Any:
        """Per-sample values as one stacked value where each is a batch-1 tensor (or a tuple
        of them), else as they are."""
        first = items[0]
        if all(_batch1(x) for x in items) and len({(x.dtype, tuple(x.shape[1:])) for x in items}) == 1:
            return torch.cat(items)
        if isinstance(first, (tuple, list)) and all(
            isinstance(x, type(first)) and len(x) == len(first) for x in items
        ):
            parts = [stacked([x[k] for x in items]) for k in range(len(first))]
            if not any(isinstance(p, PerSample) for p in parts):
                return type(first)(parts)
        return PerSample(items)

    def went_per_sample(n: Node) -> None:
        per_sample[n.name] = per_sample.get(n.name, 0) + count

    class Device(torch.fx.Interpreter):
        def sample_value(self, i: int) -> Callable[[Node], Any]:
            return lambda a: slice_of(self.env[a], i) if a in dep else self.env[a]

        def run_node(self, n: Node) -> Any:
            if n.op == "output":
                return [torch.fx.node.map_arg(n.args[0], self.sample_value(i)) for i in range(count)]
            if constants is not None and n in constants.values:
                return constants.values[n]
            if any(a in dep for a in n.all_input_nodes):
                dep.add(n)
                out = self.torch_value(n)
            else:
                out = super().run_node(n)
                if constants is not None and not is_quantize(n):
                    constants.keep(n, out)
            if not is_quantize(n) or "per_tensor" not in node_op(n):
                return out
            return self.quantize(n, out)

        def torch_value(self, n: Node) -> Any:
            """Torch's value of input-dependent ``n``: stacked where exact, else per sample."""
            if n.target is operator.getitem:
                src = self.env[n.args[0]]
                if not isinstance(src, PerSample):
                    return src[n.args[1]]
            elif _exact_stacked(n, dep) and not any(
                isinstance(self.env[a], PerSample) for a in n.all_input_nodes
            ):
                once[0] += 1
                return super().run_node(n)
            went_per_sample(n)
            items = []
            for i in range(count):
                value = self.sample_value(i)
                args = torch.fx.node.map_arg(n.args, value)
                kwargs = torch.fx.node.map_arg(n.kwargs, value)
                items.append(getattr(self, n.op)(n.target, args, kwargs))
            return stacked(items)

        def quantize(self, q: Node, out: Any) -> Any:
            """``simulate``'s step at quantize node ``q`` (torch's value ``out``), for every sample."""
            if not isinstance(out, (torch.Tensor, PerSample)):
                return out
            kind, host_op = kinds.get(q.name, (NPU, ""))
            src = q.args[0]
            if kind == PORTABLE or (kind == NPU and (not isinstance(src, Node) or src.op == "placeholder")):
                if seen is not None:
                    for i in range(count):
                        o = slice_of(out, i) if q in dep else out
                        seen[i][q.name] = (o, o)
                return out
            if q in dep and isinstance(out, torch.Tensor) and self.stacked_rule_ok(q):
                try:
                    if kind == NPU:
                        rule = Reference(self.env.__getitem__)
                    else:
                        rule = library_rule(kind, self.env.__getitem__, host_op)
                    ruled = laid_out_as(rule(q), out)
                except Exception:  # noqa: BLE001 - NotExact, or a shape the stacked call cannot take: per sample
                    pass
                else:
                    once[0] += 1
                    if seen is not None:
                        for i in range(count):
                            seen[i][q.name] = (ruled[i : i + 1], out[i : i + 1])
                    return ruled
            if q not in dep:  # every sample reads the same values: the rule's value is theirs
                first = self.one(q, kind, host_op, self.sample_value(0), out, 0)
                if q.name not in not_exact[0]:
                    if seen is not None:
                        for i in range(1, count):
                            seen[i][q.name] = seen[0][q.name]
                    return first
                results = [first] + [
                    self.one(q, kind, host_op, self.sample_value(i), out, i) for i in range(1, count)
                ]
                if all(r is out for r in results):
                    return out  # no sample forced to the program's value: one value for all
            else:
                went_per_sample(q)
                results = [
                    self.one(q, kind, host_op, self.sample_value(i), slice_of(out, i), i)
                    for i in range(count)
                ]
            dep.add(q)
            return stacked(results)

        def stacked_rule_ok(self, q: Node) -> bool:
            """Every input-dependent node ``q``'s rule reads is stacked and maps each sample's
            slice to its own (``_axis0_free``)."""
            for a in _region(q, dep):
                if isinstance(self.env.get(a), PerSample):
                    return False
                if a.op == "placeholder" or a.target is operator.getitem:
                    continue
                if is_dequantize(a) and isinstance(self.env.get(a.args[0]), PerSample):
                    return False
                op = node_op(a)
                if not _axis0_free(a, dep) or (
                    op not in _STRUCTURAL and op not in _DIM_ARG and not _exact_stacked(a, dep)
                ):
                    return False
            return True

        def one(
            self, q: Node, kind: str, host_op: str, value: Callable[[Node], Any], out: Any, i: int
        ) -> Any:
            """``simulate``'s quantize step for sample ``i`` (``value``: its values)."""
            try:
                rule = Reference(value) if kind == NPU else library_rule(kind, value, host_op)
                ruled = laid_out_as(rule(q), out)
                if seen is not None:
                    seen[i][q.name] = (ruled, out)
                return ruled
            except NotExact as why:
                if seen is not None:
                    seen[i][q.name] = (None, out)
                not_exact[i][q.name] = str(why)
                ours = program_values[i].get(q.name)
                if ours is not None and tuple(ours.shape) == tuple(out.shape):
                    off = (ours.to(torch.int32) - out.to(torch.int32)).abs()
                    if not off.numel() or int(off.max()) <= FORCE_MAX_STEPS:
                        return laid_out_as(ours, out)
                op = q.args[0]
                near = [op, *(op.args[:1] if isinstance(op, Node) else [])]
                if not _copies_codes(q, {a: value(a) for a in near if isinstance(a, Node)}):
                    unforced[i][q.name] = str(why)
                return out

    interp = Device(module, garbage_collect_values=False)
    with torch.no_grad():
        for n in module.graph.nodes:
            if n.op == "placeholder":
                k = len([m for m in interp.env if m.op == "placeholder"])
                dep.add(n)
                interp.env[n] = stacked([b[k] for b in batches])
                continue
            interp.env[n] = interp.run_node(n)
            if n.op == "output":
                raws = interp.env[n]
    return BatchedSimulation(
        [
            Simulation(list(r) if isinstance(r, (list, tuple)) else [r], not_exact[i], unforced[i], raw=r)
            for i, r in enumerate(raws)
        ],
        per_sample,
        once[0],
    )
