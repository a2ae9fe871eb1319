"""Helpers for op converters: argument access, quantization parameters seen by support checks,
bias quantization, padding choice. Op knowledge, so a plugin module; third-party op plugins
get them through ``etforge.sdk``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from torch.fx import Node

from etforge.sdk import ConversionContext, ConversionError, Quant, Value, node_op


def arg(node: Node, index: int, name: str, default: object = None) -> object:
    """Positional-or-keyword argument of an Edge node."""
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


def const_perm(node: Node, rank: int) -> tuple[int, ...]:
    """The axis permutation a ``permute`` / ``t`` / ``transpose`` node applies to a rank-``rank`` input."""
    name = node_op(node)
    if name.startswith("aten.permute"):
        return tuple(int(d) % rank for d in node.args[1])
    if name.startswith("aten.t"):
        if name.startswith("aten.transpose"):
            a, b = int(node.args[1]) % rank, int(node.args[2]) % rank
            p = list(range(rank))
            p[a], p[b] = p[b], p[a]
            return tuple(p)
        return tuple(reversed(range(rank)))
    raise AssertionError(name)


def pair(value: object, n: int = 2) -> tuple[int, ...]:
    if isinstance(value, (list, tuple)):
        vals = [int(v) for v in value]
        return tuple(vals * n if len(vals) == 1 else vals)
    return (int(value),) * n  # type: ignore[call-overload]


def bias_tensor(
    ctx: ConversionContext,
    bias: object,
    channels: int,
    x: Value,
    w_quant: Quant | None,
    name: str,
) -> int:
    """The bias input of a conv/FC: int32 with scale in*w when quantized, float32 otherwise."""
    const = ctx.constant(bias) if bias is not None else None
    if bias is not None and const is None:
        raise ConversionError(ctx.current, node_op(ctx.current), "bias is not a constant")
    if x.quant is None:  # float path
        data = const.data.astype(np.float32) if const is not None else np.zeros(channels, np.float32)
        return ctx.add_constant(data.reshape(channels), "float32", name)
    if w_quant is None:
        raise ConversionError(ctx.current, node_op(ctx.current), "int8 input with a float weight")
    w_scale = np.broadcast_to(np.asarray(w_quant.scale, np.float64), (channels,))
    scale = w_scale * x.quant.scale[0]
    if const is not None and const.dtype == "int32" and const.quant is not None:
        data = const.data.astype(np.int32).reshape(channels)
        got = np.broadcast_to(np.asarray(const.quant.scale, np.float64), (channels,))
        if not np.allclose(got, scale, rtol=1e-5):
            data = np.round(data * got / scale).astype(np.int32)  # re-derive against the actual scales
    elif const is not None:
        real = const.data.astype(np.float64).reshape(channels)
        data = np.clip(np.round(real / scale), -(2**31), 2**31 - 1).astype(np.int32)
    else:
        data = np.zeros(channels, np.int32)
    quant = Quant(tuple(float(s) for s in scale), (0,) * channels, 0)
    return ctx.add_constant(data, "int32", name, quant=quant)


def same_padding(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int, int]:
    """LiteRT SAME padding (before, after) and output size for one spatial dim."""
    eff = (kernel - 1) * dilation + 1
    out = -(-size // stride)
    total = max((out - 1) * stride + eff - size, 0)
    return total // 2, total - total // 2, out


def choose_padding(
    in_hw: Sequence[int],
    kernel: Sequence[int],
    stride: Sequence[int],
    dilation: Sequence[int],
    pads: Sequence[int],
) -> str:
    """'VALID', 'SAME' when it equals PyTorch's symmetric padding exactly, else 'EXPLICIT'."""
    if all(p == 0 for p in pads):
        return "VALID"
    for size, k, s, d, p in zip(in_hw, kernel, stride, dilation, pads, strict=True):
        before, after, out = same_padding(size, k, s, d)
        torch_out = (size + 2 * p - d * (k - 1) - 1) // s + 1
        if (before, after) != (p, p) or out != torch_out:
            return "EXPLICIT"
    return "SAME"


def pad_spatial(
    ctx: ConversionContext, x: Value, pads: Sequence[int | tuple[int, int]], value: float | None = None
) -> Value:
    """Pad H, W (per dim: p or (before, after)) ahead of a VALID op.

    ``value`` None pads with zero (int8: the zero point, which PAD uses); else PADV2 with
    ``value`` (e.g. -inf for max pooling, clamped to the int8 range).
    """
    from etforge.sdk import layout

    pairs = [(p, p) if isinstance(p, int) else tuple(p) for p in pads]
    spec = np.zeros((x.rank, 2), np.int32)
    shape = list(x.shape)
    for d, (before, after) in zip(range(2, x.rank), pairs, strict=True):
        spec[x.perm.index(d)] = (before, after)
        shape[d] += before + after
    out_shape = tuple(shape)
    out = ctx.temp(layout.apply(out_shape, x.perm), x.dtype, "pad", x.quant)
    pads_t = ctx.add_constant(spec, "int32", "paddings")
    if value is None:
        ctx.emit("PAD", [x.tensor, pads_t], [out])
    else:
        if x.quant is None:
            fill = np.asarray([max(value, float(np.finfo(np.float32).min))], np.float32)
        else:
            q = np.round(value / x.quant.scale[0]) + x.quant.zero_point[0] if np.isfinite(value) else value
            fill = np.asarray([np.clip(q, -128, 127)], np.int8)
        fill_t = ctx.add_constant(fill.reshape(()), x.dtype, "pad_value", quant=x.quant)
        ctx.emit("PADV2", [x.tensor, pads_t, fill_t], [out])
    return Value(out, out_shape, x.perm, x.dtype, x.quant)


# -- quantization parameters seen by support checks -----------------------------------------
#: Ops that only move or relabel data: a DQ behind them still gives the consumer's qparams.
_PASS_THROUGH = frozenset(
    {
        "aten.view_copy.default",
        "aten.expand_copy.default",
        "aten.clone.default",
        "dim_order_ops._clone_dim_order.default",
        "aten.squeeze_copy.dims",
        "aten.unsqueeze_copy.default",
    }
)

QParams = tuple[object, object, object]


def input_qparams(node: Node, index: int | tuple[int, int]) -> QParams | None:
    """(scale, zero_point, dtype) of the dequantize feeding ``node.args[index]`` (or
    ``node.args[i][j]``), looking through pure data movement; None when it is not quantized."""
    from etforge.sdk import is_dequantize

    try:
        a = node.args[index] if isinstance(index, int) else node.args[index[0]][index[1]]
    except (IndexError, TypeError):
        return None
    while isinstance(a, Node) and not is_dequantize(a) and node_op(a) in _PASS_THROUGH:
        a = a.args[0]
    if not is_dequantize(a) or len(a.args) < 3:
        return None
    return a.args[1], a.args[2], a.args[-1]


def output_qparams(node: Node) -> QParams | None:
    """(scale, zero_point, dtype) of the quantize of ``node``'s (first) output, else None."""
    from etforge.sdk import is_quantize

    users = list(node.users)
    if len(users) == 1 and node_op(users[0]) == "operator.getitem":
        users = list(users[0].users)
    q = next((u for u in users if is_quantize(u)), None)
    if q is None or len(q.args) < 3:
        return None
    return q.args[1], q.args[2], q.args[-1]


def shares_qparams(node: Node, inputs: Sequence[int | tuple[int, int]] = (0,)) -> bool | str:
    """True when every listed quantized input has the output's qparams (or nothing is quantized)."""
    out = output_qparams(node)
    for i in inputs:
        got = input_qparams(node, i)
        if got is None or out is None:
            continue
        if (got[0], got[1]) != (out[0], out[1]):
            return f"input {i} has scale {got[0]:.6g} zero point {got[1]}, output {out[0]:.6g} / {out[1]}"
    return True


def has_full_size_operand(node: Node) -> bool | str:
    """Some tensor input has as many elements as the output (no operand is broadcast from both sides)."""
    from math import prod

    from etforge.sdk import shape_of, tensor_inputs

    n = prod(shape_of(node))
    sizes = [prod(shape_of(a)) for a in tensor_inputs(node)]
    if any(s == n for s in sizes):
        return True
    return f"output has {n} elements, inputs {sizes}"
