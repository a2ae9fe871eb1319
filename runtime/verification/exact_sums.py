"""A convolution or linear layer of dequantized int8 values, summed as integers.

The float64 reference (``runtime.verification.reference``) evaluates a quantized program's
``conv2d(dequantize(x), dequantize(w), b)`` with torch's float64 kernels: the sum of the
float64 products ``(qx - zx) * sx * (qw - zw) * sw``, each product and partial sum rounded,
on a slow path (torch's float64 depthwise runs one small matrix product per channel). The
same value is ``sx * sw * sum((qx - zx) * (qw - zw)) + b``: the sum is an integer, and
float32 holds every integer below 2**24 exactly, so where every partial sum stays below it
(bounded by the largest input code times each output channel's sum of |weight codes|), torch's
float32 kernel computes the integer sum exactly, in any order; above it (a long linear layer)
float64's kernel does, below 2**53 (int8 codes never reach it); one float64 multiply and one
add then give the value to float64 rounding (~1e-16, as torch's float64 sum does). A node
whose operands are not of this form is evaluated by torch in float64 as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.fx import Node

from etforge.core.graph.utils import op_name

#: float32 (float64) represents every integer of magnitude below this exactly.
F32_EXACT, F64_EXACT = 2**24, 2**53

_DQ_TENSOR = "quantized_decomposed.dequantize_per_tensor.default"
_DQ_CHANNEL = "quantized_decomposed.dequantize_per_channel.default"


_SUMS = (torch.ops.aten.conv2d.default, torch.ops.aten.linear.default)


def _is_batched(t: torch.Tensor) -> bool:
    return bool(torch._C._functorch.is_batchedtensor(t))


def _value(node: Node, interp: torch.fx.Interpreter) -> Any:
    """A node's value in the run: from its environment, or a parameter read again (the
    interpreter drops a value after its last reader)."""
    if node in interp.env:
        return interp.env[node]
    return interp.fetch_attr(str(node.target)) if node.op == "get_attr" else None


def _weight(
    w_node: Node, interp: torch.fx.Interpreter, cache: dict[Node, Any] | None
) -> tuple[Any, Any, float] | None:
    """(weight codes in float32, scale per output channel or scalar, largest per-channel sum of
    |codes|) of a constant weight, or None."""
    if cache is not None and w_node in cache:
        return cache[w_node]
    w = interp.env.get(w_node)
    if not isinstance(w, torch.Tensor) or _is_batched(w) or w.dtype != torch.float64 or w.dim() < 2:
        return None
    name = op_name(w_node.target)
    if name == _DQ_TENSOR:
        scale = w_node.args[1]
        if not isinstance(scale, (int, float)):
            return None
        codes = torch.round(w / scale)
    elif name == _DQ_CHANNEL:
        if len(w_node.args) < 4 or w_node.args[3] != 0 or not isinstance(w_node.args[1], Node):
            return None  # only scales along the output channel
        scale = _value(w_node.args[1], interp)
        if not isinstance(scale, torch.Tensor) or _is_batched(scale) or scale.numel() != w.shape[0]:
            return None
        scale = scale.double()
        codes = torch.round(w / scale.reshape(-1, *[1] * (w.dim() - 1)))
    else:
        return None
    bound = float(codes.abs().reshape(w.shape[0], -1).sum(1).max()) if codes.numel() else 0.0
    found = (codes.float(), scale, bound)
    constants = getattr(interp, "constants", None)  # shared across runs: only a constant's codes
    if cache is not None and (constants is None or w_node in constants.nodes):
        cache[w_node] = found
    return found


def keep_codes(graph: torch.fx.Graph, last_uses: dict[Node, list[Node]]) -> set[Node]:
    """Keep each dequantized input's codes until the conv / linear reading it has run (an
    interpreter's ``user_to_last_uses``, edited): its integer sum starts from them. Returns
    the dequantizes whose float value no reader needs when its sum is taken (``DEFERRED``):
    every reader a conv / linear taking it as its input, nothing else."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    deferrable: set[Node] = set()
    for dq in graph.nodes:
        q = dq.args[0] if dq.op == "call_function" and dq.args else None
        if op_name(dq.target) != _DQ_TENSOR or not isinstance(q, Node) or q not in last_uses.get(dq, []):
            continue
        if not any(u.target in _SUMS for u in dq.users):
            continue
        last = max(dq.users, key=order.__getitem__)
        last_uses[dq].remove(q)
        last_uses.setdefault(last, []).append(q)
        if all(_reads_as_input(u, dq) for u in dq.users):
            deferrable.add(dq)
    return deferrable


def _reads_as_input(user: Node, dq: Node) -> bool:
    """``user`` is a conv / linear reading ``dq`` as its input (first argument) only."""
    if user.op != "call_function" or user.target not in _SUMS or user.kwargs or not user.args:
        return False
    return user.args[0] is dq and all(a is not dq for a in user.args[1:])


class _Deferred:
    """The value of a dequantize not computed (yet): its readers sum its codes instead."""

    def __repr__(self) -> str:
        return "DEFERRED"


#: Stands in the float64 run's environment for a deferrable dequantize's float value; a
#: reader that needs the value after all (a sum not taken) has it computed first
#: (``reference.Float64``): the same op on the same codes, so the same value.
DEFERRED = _Deferred()


@dataclass
class Sums:
    """Which convs / linears a float64 run summed as integers, and why the others were not."""

    taken: set[str] = field(default_factory=set)
    left: dict[str, str] = field(default_factory=dict)


def integer_sum(
    n: Node, interp: torch.fx.Interpreter, cache: dict[Node, Any] | None = None, sums: Sums | None = None
) -> torch.Tensor | None:
    """``n`` (an aten conv2d or linear of a per-tensor dequantized input and a dequantized
    constant weight) computed from integer sums, or None where that is not provably exact
    (then torch's float64 op computes it, as before; ``sums`` records which and why).
    ``interp``: the float64 run, holding its inputs; ``cache``: weight codes kept across calls."""
    if n.op != "call_function" or n.target not in _SUMS:
        return None
    out = _integer_sum(n, interp, cache)
    if isinstance(out, str):
        if sums is not None:
            sums.left[n.name] = out
        return None
    if sums is not None:
        sums.taken.add(n.name)
    return out


def _integer_sum(n: Node, interp: torch.fx.Interpreter, cache: dict[Node, Any] | None) -> torch.Tensor | str:
    conv = n.target is torch.ops.aten.conv2d.default
    args = list(n.args)
    if n.kwargs or len(args) < 2 or not all(isinstance(a, Node) for a in args[:2]):
        return "keyword or constant arguments"
    x_node, w_node = args[0], args[1]
    bias_node = args[2] if len(args) > 2 else None
    if conv and (len(args) > 4 and isinstance(args[4], str)):
        return f"padding {args[4]!r}"
    if op_name(x_node.target) != _DQ_TENSOR or len(x_node.args) < 5:
        return "its input is not a per-tensor dequantize"
    sx, zx, qmin, qmax = x_node.args[1:5]
    if not all(isinstance(v, (int, float)) for v in (sx, zx, qmin, qmax)):
        return "its input's quantization parameters are not constants"
    x = interp.env.get(x_node)
    bias = interp.env.get(bias_node) if isinstance(bias_node, Node) else bias_node
    if x is not DEFERRED and (not isinstance(x, torch.Tensor) or x.dtype != torch.float64):
        return "its input is not a float64 tensor"  # (a deferred dequantize is float64, of codes held)
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.dtype != torch.float64):
        return "its bias is not a float64 tensor"
    weight = _weight(w_node, interp, cache)
    if weight is None:
        return "its weight is not a dequantized constant scaled per output channel"
    codes_w, sw, per_channel = weight
    bound = max(qmax - zx, zx - qmin) * per_channel
    if bound >= F64_EXACT:
        return "a partial sum could reach 2**53"
    dtype = torch.float32 if bound < F32_EXACT else torch.float64  # exact integer sums either way
    held = interp.env.get(x_node.args[0]) if isinstance(x_node.args[0], Node) else None
    if isinstance(held, torch.Tensor) and not held.is_floating_point():  # the codes dequantized
        codes_x = held.to(dtype).sub_(zx) if zx else held.to(dtype)
    elif x is DEFERRED:
        return "its input's codes were not kept"  # not reached: deferred only with its codes held
    else:
        codes_x = torch.round(x / sx).to(dtype)  # (q - zx) * sx back to q - zx: |error| << 0.5
    codes_w = codes_w.to(dtype)
    with torch.no_grad():
        if conv:
            acc = torch.ops.aten.conv2d.default(codes_x, codes_w, None, *args[3:])
        else:
            acc = torch.nn.functional.linear(codes_x, codes_w)
    scale = sx * sw
    shape = (-1, 1, 1) if conv else (-1,)  # a conv2d's channels: third from the end, batched or not
    if isinstance(scale, torch.Tensor):
        scale = scale.reshape(shape)
    out = acc.double().mul_(scale)
    if bias is not None:
        out.add_(bias.reshape(shape) if conv else bias)
    return out
