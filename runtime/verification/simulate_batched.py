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
#: Reshapes: on stacked samples, each sample's elements (a block of rows, in order) become its
#: block of the result's rows when the target's first size is the samples' count times the
#: sample's (the target is rewritten so); the rules read their literal shapes: per sample.
_RESHAPES = {
    "aten.view.default",
    "aten.reshape.default",
    "aten._unsafe_view.default",
    "aten.view_copy.default",
}
#: Ops whose dim argument (position, default) must not be axis 0.
_DIM_ARG = {
    "aten.split.Tensor": (2, 0), "aten.split_with_sizes.default": (2, 0), "aten.chunk.default": (2, 0),
    "aten.unbind.int": (1, 0),
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


def _rows(v: Any) -> bool:
    """A tensor with a first axis: samples stack along it, each its own block of rows."""
    return isinstance(v, torch.Tensor) and v.dim() >= 1


def _outputs_rows(n: Node) -> bool:
    v = _meta(n)
    if isinstance(v, (tuple, list)):
        return bool(v) and all(_rows(x) for x in v)
    return _rows(v)


def _first(v: Any) -> torch.Tensor:
    return v[0] if isinstance(v, (tuple, list)) else v


def _dims(v: Any) -> list[int]:
    return [int(d) for d in (v if isinstance(v, (list, tuple)) else [v])]


def _axis0_free(n: Node, dep: set[Node]) -> bool:
    """``n`` maps each sample's block of rows (axis 0) to its own output block when given
    stacked values: every input-dependent value it reads has the output's rows, an elementwise
    op's other operands broadcast along axis 0, and no argument names axis 0 (a reshape: see
    ``_RESHAPES``)."""
    if n.op != "call_function" or not _outputs_rows(n):
        return False
    op = node_op(n)
    out = _first(_meta(n))
    rank = out.dim()
    inputs = n.all_input_nodes
    if not all(isinstance(_meta(a), torch.Tensor) for a in inputs):
        return False
    if not all(_rows(_meta(a)) for a in inputs if a in dep):
        return False
    if op in _RESHAPES:  # one input, any rows: its elements, in order, are the sample's
        return [a for a in inputs if a in dep] == [n.args[0]] and len(inputs) == 1
    if any(_meta(a).shape[0] != out.shape[0] for a in inputs if a in dep):
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
        or op in _RESHAPES
        or op
        in ("aten.split.Tensor", "aten.split_with_sizes.default", "aten.chunk.default", "aten.unbind.int")
    )
    return exact and _axis0_free(n, dep)


_CODES = {torch.int8: (-128, 127), torch.uint8: (0, 255)}


def _quantize(
    x: Any, scale: Any, zero_point: Any, quant_min: Any, quant_max: Any, dtype: Any, **kwargs: Any
) -> torch.Tensor | None:
    """``quantized_decomposed.quantize_per_tensor``'s formula, ``clamp(round(x * (1 / scale)) +
    zero_point, quant_min, quant_max).to(dtype)``: the same kernels in the same order, on one
    buffer in place instead of a new tensor per step (the stacked values' (de)quantizes: 4x
    faster); None where its arguments are not the plain case (then torch's op runs)."""
    bounds = _CODES.get(dtype)
    if (
        kwargs
        or bounds is None
        or not isinstance(x, torch.Tensor)
        or x.dtype != torch.float32
        or type(scale) is not float
        or type(zero_point) is not int
        or type(quant_min) is not int
        or type(quant_max) is not int
        or not bounds[0] <= quant_min <= quant_max <= bounds[1]
    ):
        return None
    value = x * (1.0 / scale)
    value.round_().add_(zero_point).clamp_(quant_min, quant_max)
    return value.to(dtype)


def _dequantize(
    x: Any, scale: Any, zero_point: Any, quant_min: Any, quant_max: Any, dtype: Any, **kwargs: Any
) -> torch.Tensor | None:
    """``quantized_decomposed.dequantize_per_tensor``'s formula, ``(x.to(float32) - zero_point)
    * scale``, in place on the float copy; None where its arguments are not the plain case."""
    if (
        any(k != "out_dtype" for k in kwargs)
        or kwargs.get("out_dtype") not in (None, torch.float32)
        or dtype not in _CODES
        or not isinstance(x, torch.Tensor)
        or x.dtype != dtype
        or type(scale) is not float
        or type(zero_point) is not int
    ):
        return None
    value = x.to(torch.float32)
    return value.sub_(zero_point).mul_(scale)


#: Torch ops run on the stack by an in-place form of their own formula (``_quantize``).
_IN_PLACE: dict[str, Callable[..., torch.Tensor | None]] = {
    "quantized_decomposed.quantize_per_tensor.default": _quantize,
    "quantized_decomposed.dequantize_per_tensor.default": _dequantize,
}


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


def _as_traced(v: Any, n: Node) -> Any:
    """``v`` (one sample's slice of a stacked value) with the strides the per-sample run gives
    ``n``'s value — the traced ones (``n.meta["val"]``) — where they differ: a stacked value
    is laid out by the stack (a reshape of the stack, a concatenation of per-sample results),
    and a float reduction over it could round differently from the per-sample run."""
    m = _meta(n)
    if not isinstance(v, torch.Tensor) or not isinstance(m, torch.Tensor) or tuple(v.shape) != tuple(m.shape):
        return v
    want = tuple(m.stride())
    if all(a == b for a, b, size in zip(v.stride(), want, v.shape, strict=True) if size != 1):
        return v
    return torch.empty_strided(v.shape, want, dtype=v.dtype).copy_(v)


def last_readers(graph: torch.fx.Graph) -> dict[Node, int]:
    """Per node, the position of the last node that reads its value: a user, or a quantize
    node whose rule reads it (``_region``, with the dequantizes' inputs: the codes); after
    that its value can go (the batched pass holds every sample's, not one's)."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    last: dict[Node, int] = {}
    for n in graph.nodes:
        for a in n.all_input_nodes:
            last[a] = max(last.get(a, 0), order[n])
        if not is_quantize(n):
            continue
        seen: set[Node] = set()
        todo = [n.args[0]]
        while todo:
            a = todo.pop()
            if not isinstance(a, Node) or a in seen:
                continue
            seen.add(a)
            last[a] = max(last.get(a, 0), order[n])
            if a.op == "placeholder":
                continue
            if is_dequantize(a):
                for b in a.all_input_nodes:
                    last[b] = max(last.get(b, 0), order[n])
                continue
            todo.extend(a.all_input_nodes)
    return last


def sample_bytes(graph: torch.fx.Graph) -> int:
    """Bytes one sample adds to a batched pass: its values alive at once at the worst point
    (``last_readers``), and a rule's int64 temporaries on the largest value (a few of them)."""
    last = last_readers(graph)
    order = list(graph.nodes)
    alive, peak, largest = 0, 0, 0
    ends: dict[int, int] = {}
    for i, n in enumerate(order):
        v = n.meta.get("val")
        size = v.numel() * v.element_size() if isinstance(v, torch.Tensor) else 0
        largest = max(largest, v.numel() if isinstance(v, torch.Tensor) else 0)
        alive += size
        ends[last.get(n, i)] = ends.get(last.get(n, i), 0) + size
        peak = max(peak, alive)
        alive -= ends.pop(i, 0)
    return peak + 40 * largest


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
    # per node, within this pass: whether its torch op / the ops a rule reads map each sample's
    # rows to its own (``_exact_stacked``, ``_axis0_free``: asked again by every rule reading
    # the node; a node's answer is settled once its inputs ran, as ``dep`` only grows by them)
    exact_memo: dict[Node, bool] = {}
    free_memo: dict[Node, bool] = {}

    def exact_stacked(n: Node) -> bool:
        found = exact_memo.get(n)
        if found is None:
            found = exact_memo[n] = _exact_stacked(n, dep)
        return found

    def axis0_free(n: Node) -> bool:
        found = free_memo.get(n)
        if found is None:
            found = free_memo[n] = _axis0_free(n, dep)
        return found

    def slice_of(v: Any, i: int) -> Any:
        if isinstance(v, PerSample):
            return v.items[i]
        if isinstance(v, torch.Tensor):
            rows = v.shape[0] // count
            return v[i * rows : (i + 1) * rows]
        if isinstance(v, (tuple, list)):
            return type(v)(slice_of(x, i) for x in v)
        return v

    def stacked(items: list[Any]) -> Any:
        """Per-sample values as one stacked value where they are tensors of one shape with a
        first axis (or tuples of them), else as they are."""
        first = items[0]
        if all(_rows(x) for x in items) and len({(x.dtype, tuple(x.shape)) for x in items}) == 1:
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

        def traced_value(self, i: int) -> Callable[[Node], Any]:
            """Sample ``i``'s values laid out as the program traced them (``_as_traced``): a
            float op's result can depend on its input's memory order (a reduction's order)."""
            return lambda a: _as_traced(slice_of(self.env[a], i), a) if a in dep else self.env[a]

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
            elif exact_stacked(n) and not any(isinstance(self.env[a], PerSample) for a in n.all_input_nodes):
                value = self.stacked_run(n)
                if value is not None:
                    once[0] += 1
                    return value
            went_per_sample(n)
            per = {a: self.traced_samples(a) for a in n.all_input_nodes if a in dep}
            items = []
            for i in range(count):
                value = lambda a, i=i: per[a][i] if a in per else self.env[a]  # noqa: E731
                args = torch.fx.node.map_arg(n.args, value)
                kwargs = torch.fx.node.map_arg(n.kwargs, value)
                items.append(getattr(self, n.op)(n.target, args, kwargs))
            return stacked(items)

        def traced_samples(self, a: Node) -> list[Any]:
            """``traced_value(i)(a)`` for every sample: a stacked tensor's blocks of rows in one
            split, each laid out as traced (they share their shape and strides, so the first
            answers for all whether ``_as_traced`` copies)."""
            v = self.env[a]
            if not isinstance(v, torch.Tensor) or not v.dim() or not v.shape[0] or v.shape[0] % count:
                return [_as_traced(slice_of(v, i), a) for i in range(count)]
            parts = list(v.split(v.shape[0] // count))
            if _as_traced(parts[0], a) is parts[0]:
                return parts
            return [_as_traced(p, a) for p in parts]

        def stacked_run(self, n: Node) -> Any:
            """``n`` run once on the stacked values (a reshape to the stacked shape), None when
            that fails or gives other than each sample's shape stacked: then per sample."""
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            want = _meta(n)
            if node_op(n) in _RESHAPES:
                args = (args[0], [count * want.shape[0], *want.shape[1:]], *args[2:])
            try:
                fast = _IN_PLACE.get(node_op(n))
                value = fast(*args, **kwargs) if fast is not None else None
                if value is None:
                    value = self.call_function(n.target, args, kwargs)
            except Exception:  # noqa: BLE001 - a view the stacked strides cannot take: per sample
                return None
            if isinstance(want, (tuple, list)):
                if not isinstance(value, (tuple, list)) or len(value) != len(want):
                    return None
                pairs = list(zip(value, want, strict=True))
            else:
                pairs = [(value, want)]
            for v, w in pairs:
                if not isinstance(v, torch.Tensor) or tuple(v.shape) != (count * w.shape[0], *w.shape[1:]):
                    return None
            return value

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
                    value = rule(q)
                    if tuple(value.shape) != tuple(out.shape):
                        raise ValueError("not the stacked shape")
                    ruled = laid_out_as(value, out)
                except Exception:  # noqa: BLE001 - NotExact, or a shape the stacked call cannot take: per sample
                    pass
                else:
                    once[0] += 1
                    if seen is not None:  # each sample's block of rows (``slice_of``), in one call
                        rows = out.shape[0] // count
                        for i, pair in enumerate(zip(ruled.split(rows), out.split(rows), strict=True)):
                            seen[i][q.name] = pair
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
                    self.one(q, kind, host_op, self.traced_value(i), slice_of(out, i), i)
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
                if (
                    op in _RESHAPES
                    or not axis0_free(a)
                    or (op not in _STRUCTURAL and op not in _DIM_ARG and not exact_stacked(a))
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
    last = last_readers(module.graph)
    done: dict[int, list[Node]] = {}
    for n, i in last.items():
        done.setdefault(i, []).append(n)
    flat_inputs = [module.graph.process_inputs(*b) for b in batches]  # as ``Interpreter.run`` takes them
    with torch.no_grad():
        k = 0
        for i, n in enumerate(module.graph.nodes):
            if n.op == "placeholder":
                dep.add(n)
                interp.env[n] = stacked([b[k] for b in flat_inputs])
                k += 1
                continue
            interp.env[n] = interp.run_node(n)
            if n.op == "output":  # structured as ``forward`` returns it (``Interpreter.run`` does so)
                raws = [module.graph.process_outputs(r) for r in interp.env[n]]
            for a in done.get(i, ()):  # read by nothing after this: every sample's value goes
                if a in dep and a.op != "output":
                    del interp.env[a]
    return BatchedSimulation(
        [
            Simulation(list(r) if isinstance(r, (list, tuple)) else [r], not_exact[i], unforced[i], raw=r)
            for i, r in enumerate(raws)
        ],
        per_sample,
        once[0],
    )
