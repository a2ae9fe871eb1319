"""Dim orders the device's kernels accept, and a pass that gives every kernel what it accepts.

On channels-last (Cortex-M) targets the program's 4-D tensors are NHWC, but ExecuTorch's
portable kernels have their own rules (``kernels/portable/cpu``):

* ``tensors_have_same_dim_order``: a kernel's tensors are all contiguous or all channels-last
  (a 0-d or 1-D tensor counts as contiguous, and only a 4-D/5-D tensor can be channels-last),
  else the kernel fails the call;
* ``cat``, ``slice_copy``, ``flip`` and the other kernels in ``CONTIGUOUS_ONLY`` index their
  tensors with leading/trailing dims (``getTrailingDims``, ``coordinateToIndex``) as if
  contiguous: on non-trivial channels-last tensors they pass the check and compute other
  values (``tests/test_device_conformance.py`` runs each on the device to find them);
* a broadcasting elementwise kernel writes its output linearly as if contiguous.

CMSIS-NN's convolutions (``cortex_m::``) want NHWC inputs and outputs. ``problem`` states these
rules for one kernel call; ``etforge verify`` refuses (each CPU backend's ``dim_order_problem``) a ``.pte`` that breaks them
(what the device refuses or miscomputes), and ``align`` rewrites the Edge program after the
Cortex-M lowering so it breaks none: a 0-d constant operand becomes a scalar argument, and
any other call that breaks a rule runs on contiguous copies of its inputs, its result copied
back to the dim order its users were given (``_to_dim_order_copy``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch.export import ExportedProgram
from torch.fx import Node

from etforge.sdk import KernelArg

#: Portable kernels that index with leading/trailing dims (or memcpy rows) as if contiguous.
CONTIGUOUS_ONLY = frozenset(
    {
        "cat",
        "constant_pad_nd",
        "cumsum",
        "dequantize_per_channel",
        "embedding",
        "flip",
        "gather",
        "index",
        "index_put",
        "index_select",
        "masked_select",
        "narrow_copy",
        "native_batch_norm",
        "native_layer_norm",
        "pixel_shuffle",
        "permute_copy",
        "pixel_unshuffle",
        "quantize_per_channel",
        "repeat",
        "roll",
        "scatter",
        "scatter_add",
        "select_copy",
        "select_scatter",
        "slice_copy",
        "slice_scatter",
        "split_copy",
        "split_with_sizes_copy",
        "stack",
        "topk",
        "tril",
        "unbind_copy",
        "unfold_copy",
    }
)

#: Portable elementwise kernels that broadcast (``BroadcastIndexesRange``: output index linear).
BROADCASTING = frozenset(
    {
        "add",
        "atan2",
        "bitwise_and",
        "bitwise_or",
        "bitwise_xor",
        "clamp",
        "div",
        "eq",
        "floor_divide",
        "fmod",
        "ge",
        "gt",
        "le",
        "logical_and",
        "logical_or",
        "logical_xor",
        "lt",
        "maximum",
        "minimum",
        "mul",
        "ne",
        "pow",
        "remainder",
        "rsub",
        "sub",
        "where",
    }
)

#: Arguments a portable kernel leaves out of its same-dim-order check.
UNCHECKED: dict[str, frozenset[str]] = {
    "convolution": frozenset({"weight", "bias"}),
    "index": frozenset({"indices"}),
    "index_select": frozenset({"index"}),
    "native_layer_norm": frozenset({"weight", "bias"}),
    "native_group_norm": frozenset({"weight", "bias"}),
    "_native_batch_norm_legit_no_training": frozenset({"weight", "bias", "running_mean", "running_var"}),
    "native_batch_norm": frozenset({"weight", "bias", "running_mean", "running_var"}),
    # each tensor alone contiguous or channels-last (check_max_pool2d_with_indices_args)
    "max_pool2d_with_indices": frozenset({"self", "out", "indices"}),
    "_to_dim_order_copy": frozenset({"self"}),
    # quantized_decomposed: the quantization parameters are 0-d / 1-D tensors
    "quantize_per_tensor": frozenset({"scale", "zero_point"}),
    "dequantize_per_tensor": frozenset({"scale", "zero_point"}),
    "quantize_per_channel": frozenset({"scales", "zero_points"}),
    "dequantize_per_channel": frozenset({"scales", "zero_points"}),
    "_clone_dim_order": frozenset({"self"}),
}

#: CMSIS-NN ops whose input and output must be NHWC (``is_channels_last_tensor``; the pools
#: through ``prepare_cmsis_pool2d_config``).
NHWC_ONLY = frozenset(
    {
        "quantized_avg_pool2d",
        "quantized_conv2d",
        "quantized_depthwise_conv2d",
        "quantized_max_pool2d",
        "quantized_transpose_conv2d",
    }
)

#: CMSIS-NN ops that read and write memory in the logical dims' order (``arm_transpose_s8``
#: walks the sizes it is given): their input and output must be contiguous.
CONTIGUOUS_CORTEX_M = frozenset({"transpose"})

#: Namespaces of ExecuTorch's portable kernels and its quantized kernels (``kernels/quantized``:
#: the per-channel ones find a value's channel as if contiguous, ``(i / block) % C``).
PORTABLE = frozenset({"aten", "dim_order_ops", "quantized_decomposed"})


def is_contiguous(order: Sequence[int]) -> bool:
    return all(int(d) == i for i, d in enumerate(order))


def is_channels_last(order: Sequence[int]) -> bool:
    """ExecuTorch's ``is_channels_last_dim_order``: 4-D (0,2,3,1) or 5-D (0,2,3,4,1) only."""
    n = len(order)
    return n in (4, 5) and tuple(order) == (0, *range(2, n), 1)


def trivial(arg: KernelArg) -> bool:
    """Same bytes as contiguous: the order only moves size-1 dims."""
    moved = [d for d in arg.order if arg.sizes[d] != 1]
    return moved == sorted(moved)


def same_dim_order(args: Sequence[KernelArg]) -> bool:
    """``tensors_have_same_dim_order``: all contiguous or all channels-last."""
    return all(is_contiguous(a.order) for a in args) or all(is_channels_last(a.order) for a in args)


def _cortex_m_nhwc(arg: KernelArg) -> bool:
    """CMSIS-NN wrappers' ``is_channels_last_tensor`` (ambiguous when C or H×W is 1)."""
    if len(arg.sizes) != 4:
        return False
    n, c, h, w = arg.sizes
    return c == 1 or (h == 1 and w == 1) or tuple(arg.order) == (0, 2, 3, 1)


def _leading_ones_stripped(sizes: Sequence[int]) -> tuple[int, ...]:
    i = 0
    while i < len(sizes) and sizes[i] == 1:
        i += 1
    return tuple(sizes[i:])


def problem(op: str, args: Sequence[KernelArg]) -> str | None:
    """Why the device's kernel for ``op`` (``ns::name``) refuses or miscomputes this call; None if fine."""
    ns, _, name = op.rpartition("::")
    if ns == "cortex_m":
        if name in CONTIGUOUS_CORTEX_M:
            odd = [
                a
                for a in args
                if a.name in ("input", "out") and not is_contiguous(a.order) and not trivial(a)
            ]
            if odd:
                return f"CMSIS-NN's {name} walks memory in logical order: on {odd[0].label()} it computes other values"
            return None
        if name not in NHWC_ONLY:
            return None
        for a in args:
            if a.name not in ("input", "out"):
                continue
            if name == "quantized_conv2d" and len(a.sizes) == 4 and a.sizes[1] == 1:
                continue
            if not _cortex_m_nhwc(a):
                return f"CMSIS-NN's {name} needs channels-last (NHWC) tensors, got {a.label()}"
        return None
    return portable_problem(op, args)


def portable_problem(op: str, args: Sequence[KernelArg]) -> str | None:
    """``problem`` for ExecuTorch's portable and quantized kernels (``PORTABLE`` namespaces)."""
    ns, _, name = op.rpartition("::")
    if ns not in PORTABLE:
        return None
    checked = [a for a in args if a.name not in UNCHECKED.get(name, frozenset())]
    if not same_dim_order(checked):
        got = ", ".join(a.label() for a in checked)
        return f"the portable kernel refuses tensors of different dim orders ({got})"
    if name in CONTIGUOUS_ONLY:
        odd = [a for a in args if not is_contiguous(a.order) and not trivial(a)]
        if odd:
            return (
                f"the portable {name} kernel indexes its tensors as if contiguous: on {odd[0].label()} "
                "the device computes other values"
            )
    if name in BROADCASTING:
        outs = [a for a in args if a.out and not is_contiguous(a.order) and not trivial(a)]
        ins = [a for a in args if not a.out]
        if outs and any(
            _leading_ones_stripped(a.sizes) != _leading_ones_stripped(outs[0].sizes) for a in ins
        ):
            return (
                f"the portable {name} kernel broadcasts into {outs[0].label()} as if it were "
                "contiguous: the device computes other values"
            )
    return None


# -- the pass ------------------------------------------------------------------------------


def _val(node: Any) -> Any:
    import torch

    v = node.meta.get("val") if isinstance(node, Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _order(val: Any) -> tuple[int, ...]:
    from executorch.exir.tensor import dim_order_from_stride

    return tuple(int(d) for d in dim_order_from_stride(tuple(val.stride())))


def _arg(name: str, val: Any, out: bool = False) -> KernelArg:
    return KernelArg(name, tuple(int(s) for s in val.shape), _order(val), out)


def _schema(node: Node) -> Any:
    return getattr(node.target, "_schema", None)


def _op(node: Node) -> str | None:
    schema = _schema(node)
    return None if schema is None else str(schema.name)


def node_args(node: Node) -> list[KernelArg] | None:
    """The call's tensors as ``problem`` takes them (None: not an op with tensor outputs)."""
    schema = _schema(node)
    val = node.meta.get("val")
    outs = [v for v in (val if isinstance(val, (list, tuple)) else [val]) if _is_tensor(v)]
    if schema is None or not outs:
        return None
    args: list[KernelArg] = []
    for i, s in enumerate(schema.arguments):
        value = node.args[i] if i < len(node.args) else node.kwargs.get(s.name)
        items = value if isinstance(value, (list, tuple)) else [value]
        for item in items:
            v = _val(item)
            if v is not None:
                args.append(_arg(s.name, v))
    args.extend(_arg("out", v, out=True) for v in outs)
    return args


def _is_tensor(v: Any) -> bool:
    import torch

    return isinstance(v, torch.Tensor)


def _constant(ep: ExportedProgram, node: Any) -> Any:
    """The value of a lifted constant / buffer / parameter placeholder, else None."""
    if not isinstance(node, Node) or node.op != "placeholder":
        return None
    sig = ep.graph_signature
    for table, store in (
        (sig.inputs_to_lifted_tensor_constants, ep.constants),
        (sig.inputs_to_buffers, ep.state_dict),
        (sig.inputs_to_parameters, ep.state_dict),
    ):
        if node.name in table:
            return store.get(table[node.name], ep.constants.get(table[node.name]))
    return None


_SCALAR_FORMS = {"add": "Scalar", "sub": "Scalar", "mul": "Scalar", "div": "Scalar"}


def _to_scalar(ep: ExportedProgram, node: Node) -> bool:
    """``x op c`` with ``c`` a 0-d float constant of ``x``'s dtype: ``op.Scalar(x, c)`` (the
    portable kernel computes ``x op (float)c`` either way; a scalar has no dim order)."""
    from executorch.exir.dialects._ops import ops as exir_ops

    schema = _schema(node)
    name = str(schema.name).rpartition("::")[2]
    if name not in _SCALAR_FORMS or schema.overload_name != "Tensor" or len(node.args) < 2:
        return False
    a, b = node.args[0], node.args[1]
    if _constant(ep, b) is None and name in ("add", "mul") and _constant(ep, a) is not None:
        a, b = b, a  # commutative: the constant second
    c, va = _constant(ep, b), _val(a)
    if c is None or va is None or c.dim() != 0 or c.dtype != va.dtype or not c.is_floating_point():
        return False
    target = getattr(getattr(exir_ops.edge.aten, name), _SCALAR_FORMS[name])
    node.target = target
    node.args = (a, float(c.item()), *node.args[2:])
    return True


def _copy(
    graph: Any, x: Node, order: Sequence[int], before: Node | None = None, after: Node | None = None
) -> Node:
    from executorch.exir.dialects._ops import ops as exir_ops

    target = exir_ops.edge.dim_order_ops._to_dim_order_copy.default
    where = graph.inserting_before(before) if before is not None else graph.inserting_after(after)
    with where:
        copy = graph.call_function(target, (x,), {"dim_order": list(order)})
    copy.meta = {k: v for k, v in x.meta.items() if k in ("stack_trace", "nn_module_stack")}
    copy.meta["val"] = target(_val(x), dim_order=list(order))
    return copy


#: Copies made so far, by (tensor, dim order): a later user of the same tensor reuses one.
Copies = dict[tuple[Node, tuple[int, ...]], Node]


def _shared_copy(graph: Any, copies: Copies, x: Node, order: tuple[int, ...], user: Node) -> Node:
    """``x`` in ``order``, made before its first user that needs it (which precedes the rest)."""
    if (x, order) not in copies:
        copies[(x, order)] = _copy(graph, x, order, before=user)
    return copies[(x, order)]


def _refake(node: Node) -> None:
    """The node's value recomputed from its (changed) inputs' fake values."""
    import torch

    args = torch.fx.node.map_arg(node.args, lambda n: n.meta.get("val"))
    kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: n.meta.get("val"))
    node.meta["val"] = node.target(*args, **kwargs)


def _contiguous_run(graph: Any, node: Node, copies: Copies) -> None:
    """Run ``node`` on contiguous copies of its inputs (``copies``: made so far, shared by
    later users); its users get its old dim order back."""

    def contiguous(x: Node) -> Node:
        v = _val(x)
        if v is None or is_contiguous(_order(v)):
            return x
        return _shared_copy(graph, copies, x, tuple(range(v.dim())), node)

    import torch

    if _val(node) is None:  # several outputs, each taken by getitem nodes
        olds = [(u, _order(_val(u))) for u in node.users]
        node.args = torch.fx.node.map_arg(node.args, contiguous)
        node.kwargs = torch.fx.node.map_arg(node.kwargs, contiguous)
        _refake(node)
        for u, was in olds:
            u.meta["val"] = node.meta["val"][u.args[1]]
            if _order(_val(u)) != was:
                users = list(u.users)
                back = _copy(graph, u, was, after=u)
                for w in users:
                    w.replace_input_with(u, back)
        return
    old = _order(_val(node))
    node.args = torch.fx.node.map_arg(node.args, contiguous)
    node.kwargs = torch.fx.node.map_arg(node.kwargs, contiguous)
    _refake(node)
    if _order(_val(node)) != old:
        users = list(node.users)
        back = _copy(graph, node, old, after=node)
        for u in users:
            u.replace_input_with(node, back)


_DIM_ORDER_COPIES = frozenset({"dim_order_ops::_clone_dim_order", "dim_order_ops::_to_dim_order_copy"})


def _unserializable_copy(node: Node, args: Sequence[KernelArg]) -> bool:
    """A dim-order copy whose output ExecuTorch will serialize in another order than the one
    it asks for: strides cannot tell a channels-last tensor with C == 1 (or H*W == 1) from
    other orders, ``dim_order_from_stride`` picks e.g. (0, 2, 1, 3), and the device's
    ``check__to_dim_order_copy_args`` fails the call. When the asked order is the contiguous
    bytes anyway (only size-1 dims moved) the copy asks for contiguous instead (rewritten here)."""
    want = node.kwargs.get("dim_order")
    out = next((a for a in args if a.out), None)
    if _op(node) not in _DIM_ORDER_COPIES or want is None or out is None or len(args) != 2:
        return False
    want = tuple(int(d) for d in want)
    if out.order == want or is_contiguous(want) or not trivial(KernelArg("out", out.sizes, want)):
        return False
    node.kwargs = {**node.kwargs, "dim_order": list(range(len(want)))}
    _refake(node)
    return True


def _getitems_only(node: Node) -> bool:
    """Several tensor outputs, each read through ``getitem`` (``max.dim``, ``topk``)."""
    import operator

    vals = node.meta.get("val")
    return (
        isinstance(vals, (list, tuple))
        and all(_is_tensor(v) for v in vals)
        and all(u.op == "call_function" and u.target is operator.getitem for u in node.users)
    )


def _nhwc_inputs(graph: Any, node: Node, copies: Copies) -> None:
    """A CMSIS-NN convolution's or pool's input brought to NHWC (``copies``: shared with later
    users); its output follows from the op's own shape function."""
    x = node.args[0]
    if isinstance(x, Node) and not _cortex_m_nhwc(_arg("input", _val(x))):
        node.replace_input_with(x, _shared_copy(graph, copies, x, (0, 2, 3, 1), node))
        _refake(node)


def _becomes_view(node: Node) -> bool:
    """ExecuTorch turns every ``view_copy`` that no output takes into a view of its input's
    bytes (``ReplaceViewCopyWithViewPass``): no kernel runs, the bytes are read as the view's
    (contiguous) dim order."""
    return _op(node) == "aten::view_copy" and all(u.op != "output" for u in node.users)


def _view_problem(args: Sequence[KernelArg]) -> str | None:
    odd = [a for a in args if not a.out and not is_contiguous(a.order) and not trivial(a)]
    if odd:
        return f"a view reads the bytes of {odd[0].label()} as contiguous"
    return None


def _still_broken(node: Node, op: str) -> bool:
    after = node_args(node)
    if after is None:
        return False
    return (_view_problem(after) if _becomes_view(node) else problem(_op(node) or op, after)) is not None


def _legalized_later(node: Node) -> str | None:
    """Why ExecuTorch's ``LegalizePortableDimOrderPass`` (run by ``to_executorch``) would
    change this call, else None. It copies the input of a few portable ops (pools, mean,
    sum, expand) to contiguous when torch's ``dim_order()`` of it is not the default, and
    does not copy the result back: the op's output, and every tensor after it, would change
    layout after this pass and every check had run (an NPU partition or a CMSIS-NN kernel
    reading them in the order they were built for would read other bytes)."""
    from executorch.exir.passes.legalize_portable_dim_order_pass import LegalizePortableDimOrderPass

    if node.target not in LegalizePortableDimOrderPass._target_ops or not node.args:
        return None
    v = _val(node.args[0])
    if v is None or tuple(int(d) for d in v.dim_order()) == tuple(range(v.dim())):
        return None
    return "to_executorch would run it on a contiguous copy and keep the contiguous result"


def align(ep: ExportedProgram) -> list[str]:
    """Rewrite ``ep`` (in place) so every kernel call meets ``problem``'s rules.

    Returns one line per call changed; a call still breaking a rule (an op with several
    outputs is not rewritten) is listed as "not aligned", and ``verify`` refuses the program
    naming it.
    """
    graph = ep.graph_module.graph
    notes: list[str] = []
    copies: Copies = {}
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        op = _op(node)
        args = node_args(node)
        if op is None or args is None:
            continue
        if _unserializable_copy(node, args):
            notes.append(
                f"{node.name} ({op}): copied to contiguous (same bytes; its channels-last order was ambiguous)"
            )
            args = node_args(node) or args
        why = _view_problem(args) if _becomes_view(node) else problem(op, args)
        why = why or _legalized_later(node)
        if why is None:
            continue
        ns, _, name = op.rpartition("::")
        if _val(node) is None and not _getitems_only(node):
            notes.append(f"{node.name} ({op}) not aligned (several outputs): {why}")
            continue
        if ns == "cortex_m" and name not in CONTIGUOUS_CORTEX_M:
            _nhwc_inputs(graph, node, copies)
            how = "input copied to channels-last"
        elif _to_scalar(ep, node):
            how = "0-d constant passed as a scalar"
        else:
            _contiguous_run(graph, node, copies)
            how = "run on contiguous copies"
        if _still_broken(node, op) or _legalized_later(node):
            notes.append(f"{node.name} ({op}) not aligned: {why}")
            continue
        notes.append(f"{node.name} ({op}): {how}")
    if notes:
        graph.lint()
        ep.graph_module.recompile()
    return notes


def summary(lines: Sequence[str]) -> list[str]:
    """Report notes for what ``align`` did (its lines): one line counting the calls changed, and
    every call it could not change (``verify`` refuses those, naming the instruction)."""
    left = [ln for ln in lines if " not aligned" in ln]
    done = len(lines) - len(left)
    out = (
        [
            f"dim orders: {done} kernel call(s) changed for the device's kernels (plugins/targets/dim_orders.py)"
        ]
        if done
        else []
    )
    return out + [f"dim orders: {ln}" for ln in left]
