"""Device-exact references: a quantized Edge op computed in the device's integer arithmetic.

An NPU partition's Edge program holds each op between its dequantize and quantize nodes
(``dq -> op [-> relu/clamp] -> q``). Torch evaluates that in float and rounds half to even;
the device kernels (TFLite's reference kernels, which TFLite Micro and the NPU compiler
follow) accumulate in int32, requantize with a fixed-point multiplier and shift, and round
halves away from zero in MEAN and AVERAGE_POOL_2D. ``reference(q)`` computes the int8 value of
quantize node ``q`` from the *Edge op* — its semantics, its constants and the qparams of its
dequantize / quantize nodes — in that arithmetic (``runtime.arithmetic.tflite_int``), never from the
converted LiteRT op, so a wrong conversion (constant, axis, epsilon, scale) differs from it.

The stored layout is a device fact the Edge op does not carry: where a kernel's path depends
on it (MEAN over NHWC H, W), the LiteRT tensor's dim order is passed in. An op with no rule
here returns ``None`` and a reason; ``runtime.verification.stepwise`` keeps the <= 1 step rule for it and
lists it (the goal is an empty list). Each rule is proved against LiteRT's reference kernel
interpreter bit for bit in ``tests/test_device_ref.py``.
"""

from __future__ import annotations

import functools
import operator
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch.fx import Node

from etforge.core.contracts.converter import moving_ops
from etforge.core.graph.utils import is_dequantize, is_quantize, node_op
from etforge.core.registry.manager import Registry, registry
from etforge.runtime.arithmetic import tflite_int as ti
from etforge.runtime.arithmetic.device_ref_nonlinear import RULES as _NONLINEAR_RULES
from etforge.runtime.arithmetic.operands import NotExact, Out, Q
from etforge.runtime.arithmetic.operands import arg as _arg
from etforge.runtime.arithmetic.requantize_fused import Requantizer

#: Ops that move or select values without arithmetic: with every input on the output's grid
#: the device copies codes, so the op applied to the codes is exact.
_MOVES = {
    "aten.view_copy.default", "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
    "aten.permute_copy.default", "aten.permute.default", "aten.transpose_copy.int", "aten.transpose.int",
    "aten.t_copy.default", "aten.t.default", "aten.squeeze_copy.dims", "aten.squeeze_copy.dim",
    "aten.squeeze.dim", "aten.squeeze.dims", "aten.unsqueeze_copy.default", "aten.unsqueeze.default",
    "aten.expand_copy.default", "aten.expand.default", "aten.clone.default", "aten.slice_copy.Tensor",
    "aten.slice.Tensor", "aten.select_copy.int", "aten.select.int", "aten.cat.default",
    "aten.max_pool2d.default", "aten.max_pool2d_with_indices.default", "aten.upsample_nearest2d.vec",
    "aten.upsample_nearest2d.default", "aten.pixel_shuffle.default", "aten.pixel_unshuffle.default",
    "aten.flatten.using_ints", "aten.maximum.default", "aten.minimum.default", "aten.alias_copy.default",
    "aten._to_copy.default", "aten.split_with_sizes_copy.default", "aten.unbind_copy.int",
    "aten.split_with_sizes.default", "aten.split.Tensor", "aten.split_copy.Tensor", "aten.chunk.default",
    "aten.unbind.int", "aten.dropout.default", "aten.feature_dropout.default", "aten.contiguous.default",
}  # fmt: skip
#: Activations a kernel fuses (clamp of the output codes) and their real bounds.
_ACTIVATIONS = {
    "aten.relu.default", "aten.relu_.default", "aten.hardtanh.default", "aten.hardtanh_.default",
    "aten.clamp.default", "aten.relu6.default", "aten.relu6_.default",
}  # fmt: skip


@functools.lru_cache(maxsize=4)
def _relabel_ops(reg: Registry) -> frozenset[str]:
    """Moves of one input that only relabel or pick its codes: the ops whose converters say
    so (``moves_codes``, the same flag the partitioner reads). They convert in the input's
    qparams and their quantize node requantizes after them (``convert_quantize``)."""
    return moving_ops(reg.converters)


def _relabels_only(node: Node) -> bool:
    """``node`` and the moves feeding it, back to their dequantizes, are all relabels."""
    if node_op(node) not in _relabel_ops(registry()):
        return False
    src = node.args[0]
    return is_dequantize(src) or (isinstance(src, Node) and _relabels_only(src))


def _bounds(node: Node) -> tuple[float | None, float | None]:
    op = node_op(node)
    if op in ("aten.relu.default", "aten.relu_.default"):
        return 0.0, None
    if op in ("aten.relu6.default", "aten.relu6_.default"):
        return 0.0, 6.0
    if op in ("aten.hardtanh.default", "aten.hardtanh_.default"):
        lo = node.args[1] if len(node.args) > 1 else node.kwargs.get("min_val", -1.0)
        hi = node.args[2] if len(node.args) > 2 else node.kwargs.get("max_val", 1.0)
        return float(lo), float(hi)
    lo = node.args[1] if len(node.args) > 1 else node.kwargs.get("min")
    hi = node.args[2] if len(node.args) > 2 else node.kwargs.get("max")
    return (None if lo is None else float(lo)), (None if hi is None else float(hi))


class Reference:
    """Device-exact values of an Edge program's quantize nodes.

    ``value(node)``: a node's runtime value (the interpreter's environment: int8 inputs are
    the values the device computed, i.e. teacher-forced, or the simulation's own);
    ``perm(node)``: the dim order the device stores ``node``'s int8 value in (None: logical).
    """

    def __init__(self, value: Callable[[Node], Any], perm: Callable[[Node], Any] | None = None) -> None:
        self.value, self.perm = value, perm or (lambda n: None)

    # -- operands ----------------------------------------------------------------------------
    def _num(self, x: Any) -> np.ndarray:
        v = self.value(x) if isinstance(x, Node) else x
        if isinstance(v, torch.Tensor):
            v = v.detach().double().numpy()
        return np.asarray(v, np.float64)

    def operand(self, a: Any) -> Q | np.ndarray | Any:
        """A dequantize node's integer operand; a float constant as float64; others as is."""
        if isinstance(a, Node) and is_dequantize(a):
            codes = self.value(a.args[0])
            codes = codes.detach().to(torch.int64).numpy() if isinstance(codes, torch.Tensor) else codes
            per_channel = "per_channel" in node_op(a)
            scale, zp = ti.f32(self._num(a.args[1])), self._num(a.args[2]).astype(np.int64)
            return Q(np.asarray(codes, np.int64), scale, zp, int(a.args[3]) if per_channel else None)
        if isinstance(a, Node) and a.op == "call_function" and node_op(a) in _MOVES:
            try:  # int8 codes moved in float (a decomposed matmul's expand -> view -> bmm)
                codes, (scale, zp) = self._moved(a, None)
                return Q(codes, np.asarray(scale), np.asarray(zp, np.int64))
            except NotExact:
                pass
        if isinstance(a, Node):
            v = self.value(a)
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                return v.detach().double().numpy()
            return v
        return a

    # -- the entry point ---------------------------------------------------------------------
    def __call__(self, q: Node) -> torch.Tensor:
        """The device-exact int8 value of quantize node ``q``; ``NotExact`` when there is no rule."""
        if not is_quantize(q) or "per_tensor" not in node_op(q):
            raise NotExact("not a per-tensor quantize")
        # The device tensor is int8 with no narrower range: a quantize to [-127, 127] (a
        # symmetric operand) is [-128, 127] on the device, whose kernels clamp to the type.
        out = Out(float(ti.f32(self._num(q.args[1]))), int(self._num(q.args[2])), -128, 127)
        if q.args[5] != torch.int8:
            raise NotExact(f"quantize to {q.args[5]}")
        src = q.args[0]
        if not isinstance(src, Node):
            raise NotExact("quantizes a constant")
        acts: list[Node] = []
        while (
            node_op(src) in _ACTIVATIONS and isinstance(src.args[0], Node) and not is_dequantize(src.args[0])
        ):
            acts.append(src)
            src = src.args[0]
        lo, hi = out.qmin, out.qmax
        for a in acts:  # fused activations: a clamp of the output codes (CalculateActivationRange)
            rlo, rhi = _bounds(a)
            if rlo is not None:
                lo = max(lo, ti.quantize_value(rlo, out.scale, out.zero_point))
            if rhi is not None:
                hi = min(hi, ti.quantize_value(rhi, out.scale, out.zero_point))
        codes = self.compute(src, out)
        if isinstance(codes, np.ndarray) and codes.dtype == np.int8 and codes.ndim:  # already int8 codes
            value = torch.from_numpy(codes)
            return torch.clamp(value, lo, hi) if (lo, hi) != (-128, 127) else value
        return torch.from_numpy(
            np.asarray(np.clip(codes, lo, hi), dtype=np.int8)
        )  # 0-d: numpy gives a scalar

    def compute(self, node: Node, out: Out) -> np.ndarray:
        if is_dequantize(node):
            return self._requantize(self.operand(node), out)
        index = 0
        if node.target is operator.getitem and isinstance(node.args[0], Node):
            node, index = node.args[0], int(node.args[1])  # max_pool2d_with_indices' values, a split
            if index and node_op(node) not in _MOVES:
                raise NotExact(f"output {index} of {node_op(node)}")
        op = node_op(node)
        rule = _rule_for(op)
        if rule is not None:
            return rule(self, node, out)
        if op in _MOVES:
            return self._move(node, out, index)
        raise NotExact(f"no device-exact rule for {op}")

    # -- rules -------------------------------------------------------------------------------
    def _requantize(self, x: Any, out: Out) -> np.ndarray:
        """int8 -> int8 with other qparams: the device rescales as MUL by a unit operand
        (127 at scale 1/127, as etforge lowers a requantize: LiteRT's QUANTIZE kernel sets are
        not consistent with each other), i.e. (x - zp) * 127 by s_in * (1/127) / s_out."""
        if not isinstance(x, Q) or x.axis is not None:
            raise NotExact("requantize of a non-per-tensor operand")
        real = ti.mul_multiplier(float(x.scale), float(ti.f32(1 / 127)), out.scale)
        return out.zero_point + ti.requantize((x.codes - x.zero_point) * 127, real)

    def _relu_requantize(self, x: Any, out: Out) -> np.ndarray:
        """RELU-family kernels (QuantizedReluX): one MBQM by s_in / s_out."""
        if not isinstance(x, Q) or x.axis is not None:
            raise NotExact("activation of a non-per-tensor operand")
        return out.zero_point + ti.requantize(x.codes - x.zero_point, float(x.scale) / out.scale)

    def _activation(self, node: Node, out: Out) -> np.ndarray:
        """A standalone relu / clamp: requantize (QuantizedReluX), clamp at the real bounds."""
        codes = self._relu_requantize(self.operand(node.args[0]), out)
        rlo, rhi = _bounds(node)
        lo = out.qmin if rlo is None else max(out.qmin, ti.quantize_value(rlo, out.scale, out.zero_point))
        hi = out.qmax if rhi is None else min(out.qmax, ti.quantize_value(rhi, out.scale, out.zero_point))
        return np.clip(codes, lo, hi)

    def _move(self, node: Node, out: Out, index: int = 0) -> np.ndarray:
        """Copy/select ops: the op on the codes of inputs that share one grid; a single-input
        relabel (view, slice, select, permute, clone) onto another grid is then requantized
        as its quantize node is lowered (``_requantize``)."""
        codes, (scale, zero_point) = self._moved(node, out, index)
        if scale == out.scale and zero_point == out.zero_point:
            return codes
        if not _relabels_only(node):
            raise NotExact(f"{node_op(node)}: an input's qparams differ from the output's")
        return self._requantize(Q(codes, np.asarray(scale), np.asarray(zero_point)), out)

    def _moved(self, node: Node, out: Out | None, index: int = 0) -> tuple[np.ndarray, tuple[float, int]]:
        """A move's int8 codes and the one grid (scale, zero point) its inputs share.

        An input computed in float (a matmul decomposed after quantization: ``bmm -> view ->
        quantize``) is the device's int8 value on the quantize node's grid: the conversion
        takes that quantize through the moves (``quantize_through_moves``); ``out`` None: no
        such input (an operand read through moves)."""
        grids: set[tuple[float, int]] = set()

        def codes(a: Any) -> Any:
            if isinstance(a, (list, tuple)):
                return type(a)(codes(x) for x in a)
            if not isinstance(a, Node):
                return a
            if not is_dequantize(a) and node_op(a) in _MOVES:  # a chain of moves in float (view of clone)
                inner, grid = self._moved(a, out)
                grids.add(grid)
                return torch.from_numpy(inner.astype(np.float64))
            if (
                out is not None
                and a.op == "call_function"
                and not is_dequantize(a)
                and _rule_for(node_op(a)) is not None
            ):
                grids.add((out.scale, out.zero_point))
                value = np.clip(self.compute(a, out), out.qmin, out.qmax)  # the device's int8 tensor
                return torch.from_numpy(np.asarray(value, np.float64))
            x = self.operand(a)
            if not isinstance(x, Q):
                raise NotExact(f"{node_op(node)}: an operand is not an int8 value")
            if x.axis is not None:
                raise NotExact(f"{node_op(node)}: a per-channel operand")
            grids.add((float(x.scale), int(x.zero_point)))
            return torch.from_numpy(x.codes.astype(np.float64))

        args = codes(list(node.args))
        kwargs = {k: codes(v) for k, v in node.kwargs.items()}
        if len(grids) != 1:
            raise NotExact(f"{node_op(node)}: inputs on different grids")
        with torch.no_grad():
            res = node.target(*args, **kwargs)
        if isinstance(res, (tuple, list)):
            res = res[index]
        return res.round().to(torch.int64).numpy(), grids.pop()

    def _pad(self, node: Node, out: Out) -> np.ndarray:
        x = self.operand(node.args[0])
        if not isinstance(x, Q) or float(x.scale) != out.scale or int(x.zero_point) != out.zero_point:
            raise NotExact("pad: input qparams differ from the output's")
        value = float(_arg(node, 2, "value", 0.0))
        fill = int(np.clip(ti.quantize_value(value, out.scale, out.zero_point), out.qmin, out.qmax))
        res = torch.nn.functional.pad(torch.from_numpy(x.codes), list(node.args[1]), value=fill)
        return res.numpy()

    def _conv(self, node: Node, out: Out) -> np.ndarray:
        """CONV_2D / DEPTHWISE_CONV_2D (ConvPerChannel): int32 sums, bias, per-channel MBQM."""
        stride, padding, dilation, transposed, output_padding, groups = node.args[3:9]
        fn = lambda a, b: _conv_nd(a, b, stride, padding, dilation, groups)  # noqa: E731
        if not transposed:
            lean = self._lean_conv(
                node.args[0], node.args[1], node.args[2] if len(node.args) > 2 else None, fn, out
            )
            if lean is not None:
                return lean
        x, w = self.operand(node.args[0]), self.operand(node.args[1])
        bias = self.operand(node.args[2]) if len(node.args) > 2 else None
        if transposed:  # TRANSPOSE_CONV: the same int32 sums scattered, bias, per-channel MBQM
            acc = self._accumulate(
                x,
                w,
                lambda a, b: _conv_transpose_nd(a, b, stride, padding, output_padding, groups, dilation),
                1,
            )
            return self._finish(acc, x, w, bias, out, axis=1)
        acc = self._accumulate(x, w, fn)
        return self._finish(acc, x, w, bias, out, axis=1)

    def _conv2d(self, node: Node, out: Out) -> np.ndarray:
        """ATen's conv2d / conv1d (the PT2E program's spelling of a convolution)."""
        stride, padding = _arg(node, 3, "stride", 1), _arg(node, 4, "padding", 0)
        dilation, groups = _arg(node, 5, "dilation", 1), _arg(node, 6, "groups", 1)
        fn = lambda a, b: _conv_nd(a, b, stride, padding, dilation, groups)  # noqa: E731
        if not isinstance(padding, str):
            lean = self._lean_conv(node.args[0], node.args[1], _arg(node, 2, "bias"), fn, out)
            if lean is not None:
                return lean
        x, w = self.operand(node.args[0]), self.operand(node.args[1])
        bias = self.operand(_arg(node, 2, "bias"))
        if isinstance(padding, str):
            raise NotExact("string padding")
        acc = self._accumulate(x, w, fn)
        return self._finish(acc, x, w, bias, out, axis=1)

    def _lean_conv(self, x_node: Any, w_node: Any, bias_arg: Any, fn: Callable[..., Any], out: Out) -> Any:
        """A convolution's int8 output codes (clipped to the output's range) as ``_accumulate``
        and ``_finish`` compute them, without their int64 copies of the activations: the int8
        codes enter the float sums directly, the weights are prepared once per weight tensor
        (``_prepared``), and the requantization is a few whole-tensor passes
        (``requantize_fused``; its per-channel terms made once per layer). None where an operand is not the plain case (a
        per-tensor int8 input, symmetric int8 weights) or the headroom does not hold: then the
        step by step form runs (and raises what it raises)."""
        if not (isinstance(x_node, Node) and is_dequantize(x_node) and "per_channel" not in node_op(x_node)):
            return None
        if not (isinstance(w_node, Node) and is_dequantize(w_node) and isinstance(w_node.args[0], Node)):
            return None
        codes, w_codes = self.value(x_node.args[0]), self.value(w_node.args[0])
        if not (
            isinstance(codes, torch.Tensor)
            and codes.dtype == torch.int8
            and isinstance(w_codes, torch.Tensor)
            and w_codes.dtype == torch.int8
            and codes.numel()
            and w_codes.numel()
            and codes.dim() >= 2
        ):
            return None
        if np.any(self._num(w_node.args[2]) != 0):
            return None  # asymmetric weights: ``_accumulate`` says so
        x_zp = int(self._num(x_node.args[2]))
        weights = _prepared(w_codes)
        # ``_accumulate``'s choice of float type: any int8 code's bound first (no pass over the
        # codes); where that is not below 2^24, the codes' own, as ``_sum_bound`` takes it
        bound = max(127 - x_zp, x_zp + 128) * weights.channel_sum
        if bound >= _F32_EXACT:
            lo, hi = torch.aminmax(codes)
            bound = max(int(hi) - x_zp, x_zp - int(lo)) * weights.channel_sum
        dtype = torch.float32 if bound < _F32_EXACT else torch.float64
        with torch.no_grad():
            acc = fn(codes.to(dtype).sub_(x_zp), weights.weights(w_codes, dtype))
        x_scale = float(ti.f32(self._num(x_node.args[1])))
        w_scale = ti.f32(self._num(w_node.args[1]))
        bias = self.operand(bias_arg)
        key = (
            x_scale,
            w_scale.tobytes(),
            w_scale.shape,
            _key(bias),
            acc.shape[1],
            out.scale,
            out.zero_point,
            out.qmin,
            out.qmax,
        )
        requantizer = _REQUANTIZERS.get(key)
        if requantizer is None:
            if len(_REQUANTIZERS) >= 4096:
                _REQUANTIZERS.clear()
            b, real = self._bias_real(acc.shape[1], x_scale, w_scale, bias, out)
            requantizer = _REQUANTIZERS[key] = Requantizer(b, real, out.zero_point, out.qmin, out.qmax)
        value = requantizer(acc, bound, axis=1)
        return None if value is None else value.numpy()

    def _conv_transpose(self, node: Node, out: Out) -> np.ndarray:
        """ATen's conv_transpose1d / conv_transpose2d (the PT2E spelling of TRANSPOSE_CONV)."""
        x, w = self.operand(node.args[0]), self.operand(node.args[1])
        bias = self.operand(_arg(node, 2, "bias"))
        stride, padding = _arg(node, 3, "stride", 1), _arg(node, 4, "padding", 0)
        output_padding, groups = _arg(node, 5, "output_padding", 0), _arg(node, 6, "groups", 1)
        dilation = _arg(node, 7, "dilation", 1)
        acc = self._accumulate(
            x, w, lambda a, b: _conv_transpose_nd(a, b, stride, padding, output_padding, groups, dilation), 1
        )
        return self._finish(acc, x, w, bias, out, axis=1)

    def _linear(self, node: Node, out: Out) -> np.ndarray:
        """FULLY_CONNECTED: int32 sums, bias, a double multiplier (per-tensor or per-channel)."""
        x, w = self.operand(node.args[0]), self.operand(node.args[1])
        bias = self.operand(node.args[2]) if len(node.args) > 2 else None
        acc = self._accumulate(x, w, lambda a, b: a @ b.T)
        return self._finish(acc, x, w, bias, out, axis=-1)

    def _accumulate(
        self, x: Any, w: Any, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], out_axis: int = 0
    ) -> np.ndarray:
        """The integer sums ``fn`` computes, exactly: in float32 where every partial sum is
        provably below 2**24 (max |input| times the largest sum of one output channel's |weights|,
        the weights' ``out_axis``), in float64 otherwise (exact below 2**53)."""
        if not isinstance(x, Q) or not isinstance(w, Q) or x.axis is not None:
            raise NotExact("float weights or a per-channel input")
        if np.any(w.zero_point != 0):
            raise NotExact("asymmetric weights")
        codes = x.codes - x.zero_point
        dtype = np.float32 if _sum_bound(codes, w.codes, out_axis) < _F32_EXACT else np.float64
        a = torch.from_numpy(codes.astype(dtype))
        b = torch.from_numpy(w.codes.astype(dtype))
        with torch.no_grad():
            return fn(a, b).round().to(torch.int64).numpy()  # the float type holds these sums exactly

    def _finish(self, acc: np.ndarray, x: Q, w: Q, bias: Any, out: Out, axis: int) -> np.ndarray:
        channels = acc.shape[axis]
        shape = [1] * acc.ndim
        shape[axis] = channels
        b, real = self._bias_real(channels, float(x.scale), w.scale, bias, out)
        if b is not None:
            acc = acc + b.reshape(shape)
        real = real.reshape(shape)
        if axis == -1:  # LiteRT's FULLY_CONNECTED: a double multiplier (proved in tests)
            return out.zero_point + ti.fc_requantize(acc, real)
        return out.zero_point + ti.requantize(acc, real)

    def _bias_real(
        self, channels: int, x_scale: float, w_scale: np.ndarray, bias: Any, out: Out
    ) -> tuple[np.ndarray | None, np.ndarray]:
        """The bias on the accumulator's scale (int64 per channel, or one value; None without
        one) and the real multiplier per channel, as the kernels' Prepare computes them."""
        acc_scale = x_scale * np.broadcast_to(
            w_scale.reshape(-1), (channels,)
        )  # float32 scales multiplied in double
        b = None
        if isinstance(bias, Q):
            got = np.broadcast_to(bias.scale.reshape(-1), (channels,))
            b = bias.codes.reshape(-1).astype(np.int64)
            if not np.allclose(got, acc_scale, rtol=1e-5):  # a bias on other scales is requantized
                b = np.round(b * got / acc_scale).astype(np.int64)
        elif bias is not None and not (isinstance(bias, float) and bias == 0.0):
            if not isinstance(bias, np.ndarray):
                raise NotExact("bias is neither quantized nor a constant")
            b = np.round(bias.reshape(-1) / acc_scale).astype(np.int64)
        return b, acc_scale / out.scale

    def _binary(self, node: Node) -> tuple[Q, Q]:
        a, b = self.operand(node.args[0]), self.operand(node.args[1])
        qs = []
        for v in (a, b):
            if isinstance(v, torch.Tensor) and v.dtype not in (torch.int8, torch.uint8):
                v = v.detach().double().numpy()  # an integer constant (x * 3): as the converter reads it
            elif isinstance(v, (int, float)) and not isinstance(v, bool):
                v = np.asarray(float(v))
            if isinstance(v, np.ndarray):  # a float constant meeting int8: symmetric, own scale
                scale = float(ti.f32(float(np.abs(v).max()) / 127.0 or 1.0))
                v = Q(
                    np.clip(np.round(v / scale), -127, 127).astype(np.int64), np.float64(scale), np.int64(0)
                )
            if not isinstance(v, Q) or v.axis is not None:
                raise NotExact(f"{node_op(node)}: an operand is not a per-tensor int8 value")
            qs.append(v)
        return qs[0], qs[1]

    def _add(self, node: Node, out: Out, sign: int = 1) -> np.ndarray:
        """ADD / SUB (AddElementwise): both inputs to a common scale with left shift 20."""
        if len(node.args) > 2 or node.kwargs.get("alpha", 1) != 1:
            raise NotExact("alpha != 1")
        a, b = self._binary(node)
        twice_max = 2.0 * max(float(a.scale), float(b.scale))
        left = 20
        m1, m2 = float(a.scale) / twice_max, float(b.scale) / twice_max
        mo = twice_max / ((1 << left) * out.scale)
        (s1, bound1), (s2, bound2) = _rescaled(a, m1, left), _rescaled(b, m2, left)
        total = s1 + sign * s2
        if total.ndim and total.size >= _BY_TABLE:  # the output step in a few whole-tensor passes
            bound = bound1 + bound2
            value = Requantizer(None, mo, out.zero_point, out.qmin, out.qmax)(
                torch.from_numpy(total), bound, 0
            )
            if value is not None:
                return value.numpy()
        return out.zero_point + ti.requantize(total, mo)

    def _sub(self, node: Node, out: Out) -> np.ndarray:
        return self._add(node, out, -1)

    def _mul(self, node: Node, out: Out) -> np.ndarray:
        """MUL: the product of offset inputs, one MBQM by s1 * s2 / s_out (in float32)."""
        a, b = self._binary(node)
        real = ti.mul_multiplier(float(a.scale), float(b.scale), out.scale)
        return out.zero_point + ti.requantize((a.codes - a.zero_point) * (b.codes - b.zero_point), real)

    def _avg_pool(self, node: Node, out: Out) -> np.ndarray:
        """AVERAGE_POOL_2D: sum of codes / count, halves away from zero; padding as the
        Edge op counts it (count_include_pad: padded with the zero point)."""
        x = self._shared(node, out)
        kernel = _pair(node.args[1])
        stride = _pair(_arg(node, 2, "stride", None) or kernel)
        padding = _pair(_arg(node, 3, "padding", 0))
        ceil_mode = bool(_arg(node, 4, "ceil_mode", False))
        include = bool(_arg(node, 5, "count_include_pad", True))
        if _arg(node, 6, "divisor_override", None) is not None:
            raise NotExact("divisor_override")
        t = torch.from_numpy(x.codes.astype(np.float64))
        if include and any(padding):
            p = [padding[1], padding[1], padding[0], padding[0]]
            t = torch.nn.functional.pad(t, p, value=float(x.zero_point))
            ones = torch.nn.functional.pad(torch.ones_like(t[..., padding[0]:t.shape[-2] - padding[0], padding[1]:t.shape[-1] - padding[1]]), p, value=1.0)  # fmt: skip
            padding = (0, 0)
        else:
            ones = torch.ones_like(t)
        pool = dict(
            kernel_size=kernel, stride=stride, padding=padding, ceil_mode=ceil_mode, divisor_override=1
        )
        sums = torch.nn.functional.avg_pool2d(t, **pool)  # type: ignore[arg-type]
        counts = torch.nn.functional.avg_pool2d(ones, **pool)  # type: ignore[arg-type]
        return ti.divide_round_away(sums.round().long().numpy(), counts.round().long().numpy())

    def _adaptive_avg(self, node: Node, out: Out) -> np.ndarray:
        x = self._shared(node, out)
        h, w = x.codes.shape[-2:]
        oh, ow = _pair(node.args[1])
        if (oh, ow) == (1, 1):
            return self._mean_codes(x, out, (2, 3), True, node.args[0])
        if h % oh or w % ow:
            raise NotExact("adaptive pool with uneven windows")
        kernel = (h // oh, w // ow)
        t = torch.from_numpy(x.codes.astype(np.float64))
        sums = torch.nn.functional.avg_pool2d(t, kernel, kernel, divisor_override=1)
        return ti.divide_round_away(sums.round().long().numpy(), kernel[0] * kernel[1])

    def _mean(self, node: Node, out: Out) -> np.ndarray:
        x = self.operand(node.args[0])
        if not isinstance(x, Q) or x.axis is not None:
            raise NotExact("mean of a non-per-tensor operand")
        rank = x.codes.ndim
        dims = tuple(sorted({int(d) % rank for d in (_arg(node, 1, "dim") or range(rank))}))
        keep = bool(_arg(node, 2, "keepdim", False))
        return self._mean_codes(x, out, dims, keep, node.args[0])

    def _sum(self, node: Node, out: Out) -> np.ndarray:
        """SUM is computed by the device as a MEAN quantized at s_out / count."""
        x = self.operand(node.args[0])
        if not isinstance(x, Q) or x.axis is not None:
            raise NotExact("sum of a non-per-tensor operand")
        rank = x.codes.ndim
        dims = tuple(sorted({int(d) % rank for d in (_arg(node, 1, "dim") or range(rank))}))
        count = int(np.prod([x.codes.shape[d] for d in dims]))
        mean_out = Out(float(ti.f32(out.scale / count)), out.zero_point, out.qmin, out.qmax)
        return self._mean_codes(x, mean_out, dims, bool(_arg(node, 2, "keepdim", False)), node.args[0])

    def _mean_codes(self, x: Q, out: Out, dims: tuple[int, ...], keep: bool, src: Any) -> np.ndarray:
        """MEAN (reduce.h QuantizedMeanOrSum): the sum of the offset codes, one MBQM whose
        multiplier s_in / s_out has 1/n folded in as an integer division of the Q31 value
        (``shift`` bits of headroom); its two roundings put halves away from zero."""
        count = int(np.prod([x.codes.shape[d] for d in dims]))
        acc = (x.codes - int(x.zero_point)).sum(axis=dims, keepdims=keep)
        multiplier, shift = ti.quantize_multiplier(float(x.scale) / out.scale)
        headroom = min(count.bit_length() - 1, 32, 31 + shift)
        multiplier = (multiplier << headroom) // count
        return ti.multiply_by_quantized_multiplier(acc, multiplier, shift - headroom) + out.zero_point

    def _gelu(self, node: Node, out: Out) -> np.ndarray:
        """GELU (gelu.cc): a 256-entry table filled in float32 (LUTPopulate), exact or tanh
        as the Edge op's ``approximate`` says."""
        x = self.operand(node.args[0])
        if not isinstance(x, Q) or x.axis is not None:
            raise NotExact("gelu of a non-per-tensor operand")
        approximate = _arg(node, 1, "approximate", "none")
        v = torch.arange(-128, 128, dtype=torch.float32)
        deq = torch.tensor(np.float32(x.scale), dtype=torch.float32) * (v - float(x.zero_point))
        if approximate == "tanh":
            k = float(np.float32(np.sqrt(2.0 / np.pi)))
            y = 0.5 * deq * (1.0 + torch.tanh(k * (deq + 0.044715 * deq * deq * deq)))
        else:
            y = 0.5 * deq * (1.0 + torch.erf(deq * float(np.float32(np.sqrt(0.5)))))
        inv = np.float32(1.0) / np.float32(out.scale)
        table = ti.round_away((y.numpy() * inv).astype(np.float32)) + out.zero_point
        table = np.clip(table, out.qmin, out.qmax).astype(np.int64)
        return table[x.codes + 128]

    def _shared(self, node: Node, out: Out) -> Q:
        x = self.operand(node.args[0])
        if not isinstance(x, Q) or x.axis is not None:
            raise NotExact(f"{node_op(node)} of a non-per-tensor operand")
        if float(x.scale) != out.scale or int(x.zero_point) != out.zero_point:
            raise NotExact(f"{node_op(node)}: input and output qparams differ")
        return x


def _rule_for(op: str) -> Callable[[Reference, Node, Out], np.ndarray] | None:
    """The device-exact rule of ``op``, if there is one."""
    return _RULES.get(op) or _NONLINEAR_RULES.get(op)


#: Integers below this magnitude are exact in float32, and so is every sum of them that stays below it.
_F32_EXACT = 2**24


def _sum_bound(codes: np.ndarray, weights: np.ndarray, out_axis: int) -> int:
    """An upper bound on every partial sum of products of ``codes`` with one output channel's
    weights (each weight enters a sum once): max |code| times the largest sum of |weights| over
    one index of ``out_axis`` (for a grouped transposed conv, over all groups: larger still)."""
    if not codes.size or not weights.size:
        return 0
    per_channel = np.abs(weights).reshape(*weights.shape[: out_axis + 1], -1)
    sums = per_channel.sum(axis=-1)
    if out_axis:
        sums = sums.sum(axis=tuple(range(out_axis)))
    return max(int(codes.max()), -int(codes.min())) * int(sums.max())  # max |code|, no |codes| array


class _Weights:
    """A weight tensor's int8 codes as the convolution rules read them: the largest sum of one
    output channel's |weights| (``_sum_bound``'s, output channels on axis 0), and the codes as
    a float tensor of each type asked, kept for tensors up to ``_KEEP_WEIGHTS`` values (larger
    ones are cast on each call, as before: the copies would outweigh the model)."""

    def __init__(self, codes: torch.Tensor) -> None:
        self.ref, self.version = weakref.ref(codes), codes._version
        per_channel = codes.detach().to(torch.int32).abs().reshape(codes.shape[0], -1)
        self.channel_sum = int(per_channel.sum(dim=-1).max())
        self.cast: dict[torch.dtype, torch.Tensor] = {}

    def weights(self, codes: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        found = self.cast.get(dtype)
        if found is None:
            found = codes.detach().to(dtype)  # int8 codes: exact in either float type
            if codes.numel() <= _KEEP_WEIGHTS:
                self.cast[dtype] = found
        return found


#: From this many values on, ``_add`` rescales each input by a table of the 256 int8 codes.
_BY_TABLE = 1024


def _rescaled(x: Q, multiplier: float, left: int) -> tuple[np.ndarray, int]:
    """``ADD``'s input step, ``requantize((codes - zero point) << left, multiplier)``, and a
    bound on its magnitude: an elementwise function of the code, so for int8 codes it is looked
    up in a table of its 256 values (each computed by the same ``tflite_int.requantize``)."""
    codes = x.codes
    if codes.size >= _BY_TABLE and int(codes.min()) >= -128 and int(codes.max()) <= 127:
        table = ti.requantize((np.arange(-128, 128, dtype=np.int64) - x.zero_point) * (1 << left), multiplier)
        return table[codes + 128], int(np.abs(table).max())
    values = ti.requantize((codes - x.zero_point) * (1 << left), multiplier)
    return values, int(np.abs(values).max()) if values.size else 0


#: The largest weight tensor (values) whose float copies are kept between calls.
_KEEP_WEIGHTS = 1 << 22

#: Prepared weights by tensor (id, held weakly; a tensor changed in place is prepared again).
_WEIGHTS: dict[int, _Weights] = {}


def _prepared(codes: torch.Tensor) -> _Weights:
    """``codes``' prepared form (``_Weights``), made on first use."""
    found = _WEIGHTS.get(id(codes))
    if found is None or found.ref() is not codes or found.version != codes._version:
        for key in [k for k, v in _WEIGHTS.items() if v.ref() is None]:
            del _WEIGHTS[key]
        found = _WEIGHTS[id(codes)] = _Weights(codes)
    return found


#: A layer's requantization by its constants' values (``_lean_conv``: the input and weight
#: scales, the bias, the output grid), so a layer requantizes every batch with terms made once.
_REQUANTIZERS: dict[tuple[Any, ...], Requantizer] = {}


def _key(operand: Any) -> Any:
    """A hashable key of a bias operand's values (a ``Q``, a float array, a number, None)."""
    if isinstance(operand, Q):
        parts = (operand.codes, operand.scale, operand.zero_point)
        return (
            "q",
            operand.axis,
            *((np.asarray(p).dtype.str, np.shape(p), np.asarray(p).tobytes()) for p in parts),
        )
    if isinstance(operand, np.ndarray):
        return ("array", operand.dtype.str, operand.shape, operand.tobytes())
    return ("value", type(operand).__name__, repr(operand))


def _pair(v: Any) -> tuple[int, int]:
    if isinstance(v, int):
        return v, v
    v = list(v)
    return (int(v[0]), int(v[0])) if len(v) == 1 else (int(v[0]), int(v[1]))


def _conv_nd(
    a: torch.Tensor, b: torch.Tensor, stride: Any, padding: Any, dilation: Any, groups: int
) -> torch.Tensor:
    fn = {3: torch.nn.functional.conv1d, 4: torch.nn.functional.conv2d}.get(a.dim())
    if fn is None:
        raise NotExact(f"{a.dim() - 2}-D convolution")
    return fn(a, b, None, stride, padding, dilation, groups)


def _conv_transpose_nd(
    a: torch.Tensor,
    b: torch.Tensor,
    stride: Any,
    padding: Any,
    output_padding: Any,
    groups: int,
    dilation: Any,
) -> torch.Tensor:
    fn = {3: torch.nn.functional.conv_transpose1d, 4: torch.nn.functional.conv_transpose2d}.get(a.dim())
    if fn is None:
        raise NotExact(f"{a.dim() - 2}-D transposed convolution")
    return fn(a, b, None, stride, padding, output_padding, groups, dilation)


_RULES: dict[str, Callable[[Reference, Node, Out], np.ndarray]] = {
    "aten.convolution.default": Reference._conv,
    "aten.linear.default": Reference._linear,
    "aten.add.Tensor": Reference._add,
    "aten.sub.Tensor": Reference._sub,
    "aten.mul.Tensor": Reference._mul,
    "aten.avg_pool2d.default": Reference._avg_pool,
    "aten._adaptive_avg_pool2d.default": Reference._adaptive_avg,
    "aten.adaptive_avg_pool2d.default": Reference._adaptive_avg,
    "aten.mean.dim": Reference._mean,
    "aten.sum.dim_IntList": Reference._sum,
    "aten.constant_pad_nd.default": Reference._pad,
    "aten.conv2d.default": Reference._conv2d,
    "aten.conv1d.default": Reference._conv2d,
    "aten.conv_transpose2d.input": Reference._conv_transpose,
    "aten.conv_transpose1d.default": Reference._conv_transpose,
    "aten.add_.Tensor": Reference._add,
    "aten.relu_.default": Reference._activation,
    "aten.relu6.default": Reference._activation,
    "aten.relu6_.default": Reference._activation,
    "aten.hardtanh_.default": Reference._activation,
    "aten.relu.default": Reference._activation,
    "aten.hardtanh.default": Reference._activation,
    "aten.clamp.default": Reference._activation,
    "aten.gelu.default": Reference._gelu,
}
