"""Device-exact rules for LiteRT's int8 nonlinear and matrix kernels (reference kernel set).

Each rule computes a quantize node's int8 value from the Edge op as LiteRT's reference kernel
does (``tflite/kernels``: activations.cc, elementwise.cc, exp.cc, batch_matmul.cc):

- LOGISTIC, TANH, EXP, LOG: a 256-entry table filled once in float32 (``LUTPopulate``): the
  transform of each dequantized code, times 1/s_out, rounded half away from zero;
- SOFTMAX: gemmlowp fixed point (``PreprocessSoftmaxScaling``, exp of the difference from the
  row maximum in Q5.26, a Q12.19 sum, its reciprocal), no float at run time;
- HARD_SWISH: int16 fixed point with the kernel's two multipliers;
- LEAKY_RELU, PRELU, ABS, RSQRT: fixed-point multiplier + shift requantization, with the
  real multipliers computed in float32 where the kernel's Prepare does;
- BATCH_MATMUL / FULLY_CONNECTED for mm, bmm, addmm; NEG as etforge lowers it (MUL by -1);
- REDUCE_MAX / REDUCE_MIN (amax/amin): the op on the codes, inputs sharing the output's qparams.

Float transforms call the C library's float functions (``expf``, ``tanhf``, ``logf``) as the
kernel does; numpy's float32 ``exp`` may differ in the last bit. Proven bit for bit in
``tests/test_device_ref.py``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable
from functools import cache
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from etforge.core.graph.utils import is_constant, node_op
from etforge.runtime.arithmetic import fixedpoint as fp
from etforge.runtime.arithmetic import tflite_int as ti
from etforge.runtime.arithmetic.operands import NotExact, Out, Q
from etforge.runtime.arithmetic.operands import arg as _arg

if TYPE_CHECKING:
    from torch.fx import Node

    from etforge.runtime.arithmetic.device_ref import Reference

F32 = np.float32


@cache
def _libm() -> Any:
    """The C math library (the float functions LiteRT's tables are filled with); None if absent."""
    name = ctypes.util.find_library("m")
    if name is None:
        return None
    lib = ctypes.CDLL(name)
    for fn in ("expf", "tanhf", "logf"):
        getattr(lib, fn).restype = ctypes.c_float
        getattr(lib, fn).argtypes = [ctypes.c_float]
    return lib


def _cfloat(name: str, x: np.ndarray) -> np.ndarray:
    lib = _libm()
    if lib is None:
        raise NotExact(f"no C math library for {name}")
    fn = getattr(lib, name)
    return np.asarray([fn(float(v)) for v in x.reshape(-1)], F32).reshape(x.shape)


def _per_tensor(ref: Reference, node: Node, i: int = 0) -> Q:
    x = ref.operand(node.args[i])
    if not isinstance(x, Q) or x.axis is not None:
        raise NotExact(f"{node_op(node)} of a non-per-tensor operand")
    return x


def _lut(x: Q, out: Out, transform: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """``LUTPopulate<int8>``: the table in float32, rounded half away, then a lookup."""
    codes = np.arange(-128, 128, dtype=np.int64)
    deq = F32(x.scale) * (codes - int(x.zero_point)).astype(F32)
    y = transform(deq.astype(F32)).astype(F32)
    rescaled = ti.round_away((y * (F32(1) / F32(out.scale))).astype(F32))
    table = np.clip(rescaled + out.zero_point, out.qmin, out.qmax).astype(np.int64)
    return table[x.codes + 128]


def _sigmoid(ref: Reference, node: Node, out: Out) -> np.ndarray:
    return _lut(_per_tensor(ref, node), out, lambda v: F32(1) / (F32(1) + _cfloat("expf", -v)))


def _tanh(ref: Reference, node: Node, out: Out) -> np.ndarray:
    return _lut(_per_tensor(ref, node), out, lambda v: _cfloat("tanhf", v))


def _exp(ref: Reference, node: Node, out: Out) -> np.ndarray:
    return _lut(_per_tensor(ref, node), out, lambda v: _cfloat("expf", v))


def _log(ref: Reference, node: Node, out: Out) -> np.ndarray:
    """LOG: the table maps x <= 0 to the lowest output value."""
    lowest = F32((out.qmin - out.zero_point) * F32(out.scale))
    return _lut(
        _per_tensor(ref, node),
        out,
        lambda v: np.where(v <= 0, lowest, _cfloat("logf", np.where(v <= 0, 1, v))),
    )


def _softmax(ref: Reference, node: Node, out: Out) -> np.ndarray:
    """SOFTMAX (reference_ops::Softmax, int8): exp of (x - max) * beta * s_in in Q5.26, summed in
    Q12.19, scaled by the sum's reciprocal; differences below ``diff_min`` give the lowest code."""
    x = _per_tensor(ref, node)
    if out.zero_point != -128:
        raise NotExact("softmax output zero point is not -128")
    dim = int(node.args[1]) % x.codes.ndim
    codes = np.moveaxis(x.codes, dim, -1)
    integer_bits = 5
    real = min(float(x.scale) * (1 << (31 - integer_bits)), float((1 << 31) - 1))
    multiplier, left_shift = ti.quantize_multiplier(real)
    diff_min = -int(np.floor(((1 << integer_bits) - 1) * float(1 << (31 - integer_bits)) / (1 << left_shift)))
    diff = codes - codes.max(axis=-1, keepdims=True)
    used = diff >= diff_min
    scaled = ti.srdhm(diff * (1 << left_shift), multiplier)
    exps = fp.exp_on_negative_values(np.where(used, scaled, 0), integer_bits)
    total = np.where(used, fp.rounding_divide_by_pot(exps, 12), 0).sum(axis=-1, keepdims=True)
    scale, bits_over_unit = fp.reciprocal(total, 12)
    res = fp.rounding_divide_by_pot(ti.srdhm(scale, exps), bits_over_unit + 31 - 8) - 128
    res = np.where(used, np.clip(res, -128, 127), -128)
    return np.moveaxis(res, -1, dim)


def _multiplier16(real: float) -> tuple[int, int]:
    """``QuantizeMultiplier`` then ``DownScaleInt32ToInt16Multiplier``."""
    m, shift = ti.quantize_multiplier(real)
    m16 = 32767 if m >= ti.INT32_MAX - (1 << 15) else (m + (1 << 15)) >> 16
    return m16, shift


def _hardswish(ref: Reference, node: Node, out: Out) -> np.ndarray:
    """HARD_SWISH (reference_ops::HardSwish, int8): int16 fixed point; the "relu-ish" factor
    (x + 3) / 6 in [0, 1] at scale 3/32768, times x on a pre-shift output scale."""
    x = _per_tensor(ref, node)
    hires = F32(1.0 / 128.0) * F32(x.scale)
    out_m, out_e = _multiplier16(float(F32(hires / F32(out.scale))))
    relu_m, relu_e = _multiplier16(float(F32(hires / F32(3.0 / 32768.0))))
    if out_e > 0:
        raise NotExact("hard_swish output multiplier exponent > 0")
    v = (x.codes - int(x.zero_point)) * (1 << 7)
    pre_out = fp.srdhm16(v, out_m)
    r = v
    if relu_e > 0:
        r = np.clip(r << (relu_e - 1), fp.INT16_MIN, fp.INT16_MAX)
    r = fp.srdhm16(r, relu_m)
    if relu_e > 0:
        r = np.clip(r << 1, fp.INT16_MIN, fp.INT16_MAX)
    if relu_e < 0:
        r = fp.rounding_divide_by_pot(r, -relu_e)
    r = (r + (1 << 15)) >> 1
    prod = r * pre_out
    high = np.sign(prod) * (np.abs(prod) // (1 << 15))  # SaturatingDoublingHighMul: no rounding
    res = fp.rounding_divide_by_pot(high, -out_e) + out.zero_point
    return np.clip(res, out.qmin, out.qmax)


def _mbqm(acc: np.ndarray, real: float) -> np.ndarray:
    m, s = ti.quantize_multiplier(real)
    return ti.multiply_by_quantized_multiplier(acc, m, s)


def _leaky_relu(ref: Reference, node: Node, out: Out) -> np.ndarray:
    """LEAKY_RELU (QuantizeLeakyRelu): one multiplier for x >= 0, one for x < 0 (float32 Prepare)."""
    x = _per_tensor(ref, node)
    alpha = F32(_arg(node, 1, "negative_slope", 0.01))
    v = x.codes - int(x.zero_point)
    pos = _mbqm(v, float(F32(x.scale) / F32(out.scale)))
    neg = _mbqm(v, float(F32(F32(x.scale) * alpha) / F32(out.scale)))
    return np.clip(out.zero_point + np.where(v >= 0, pos, neg), out.qmin, out.qmax)


def _prelu(ref: Reference, node: Node, out: Out) -> np.ndarray:
    """PRELU (BroadcastPrelu4DSlow): x * s_in / s_out for x >= 0, else x * alpha * s_in * s_a / s_out."""
    x = _per_tensor(ref, node)
    a = ref.operand(node.args[1])
    if not isinstance(a, Q) or a.axis is not None:
        raise NotExact("prelu slope is not a per-tensor int8 constant")
    shape = [1] * x.codes.ndim
    if a.codes.size > 1:
        shape[1] = a.codes.size
    slope = a.codes.reshape(shape) - int(a.zero_point)
    v = x.codes - int(x.zero_point)
    pos = _mbqm(v, float(F32(x.scale) / F32(out.scale)))
    neg = _mbqm(v * slope, float(F32(F32(x.scale) * F32(a.scale)) / F32(out.scale)))
    return np.clip(out.zero_point + np.where(v >= 0, pos, neg), out.qmin, out.qmax)


def _abs(ref: Reference, node: Node, out: Out) -> np.ndarray:
    """ABS: |x - zp|, rescaled only when the scales differ (the zero points may differ freely)."""
    x = _per_tensor(ref, node)
    v = np.abs(x.codes - int(x.zero_point))
    if F32(x.scale) != F32(out.scale):
        v = _mbqm(v, float(F32(x.scale) / F32(out.scale)))
    return np.clip(v + out.zero_point, out.qmin, out.qmax)


def _rsqrt(ref: Reference, node: Node, out: Out) -> np.ndarray:
    """RSQRT (int8): 1/sqrt of the offset code as a fixed-point multiplier, scaled by
    1 / (sqrt(s_in) * s_out); 0 gives the highest code (the kernel rejects negative inputs)."""
    x = _per_tensor(ref, node)
    m, s = ti.quantize_multiplier(1.0 / float(F32(np.sqrt(F32(x.scale)) * F32(out.scale))))
    table = {}
    for value in np.unique(x.codes - int(x.zero_point)).tolist():
        if value <= 0:
            table[value] = out.qmax
            continue
        inv_m, inv_s = fp.inv_sqrt_multiplier(value, -1)
        data = ti.multiply_by_quantized_multiplier(np.int64(1), inv_m, inv_s + 20)
        res = int(ti.multiply_by_quantized_multiplier(data, m, s - 20)) + out.zero_point
        table[value] = int(np.clip(res, out.qmin, out.qmax))
    v = x.codes - int(x.zero_point)
    return np.vectorize(table.__getitem__, otypes=[np.int64])(v) if v.size else v


def _neg(ref: Reference, node: Node, out: Out) -> np.ndarray:
    """NEG as etforge lowers int8: MUL by code -127 at scale 1/127."""
    x = _per_tensor(ref, node)
    real = ti.mul_multiplier(float(x.scale), float(ti.f32(1 / 127)), out.scale)
    return out.zero_point + ti.requantize((x.codes - x.zero_point) * -127, real)


def _matmul(ref: Reference, node: Node, out: Out) -> np.ndarray:
    """mm / bmm / addmm: int32 sums of offset codes, + bias, one requantization: the
    FULLY_CONNECTED kernel's (a double multiplier) for a constant right operand, else
    BATCH_MATMUL's (MBQM, two roundings, of the scales' float32 product over the output scale:
    in double, 8 of 278,528 values of deit_tiny's attention qparams are one step off)."""
    op = node_op(node)
    addmm = op.startswith("aten.addmm")
    ia, ib = (1, 2) if addmm else (0, 1)
    a, b = ref.operand(node.args[ia]), ref.operand(node.args[ib])
    if not isinstance(a, Q) or not isinstance(b, Q) or a.axis is not None:
        raise NotExact(f"{op}: an operand is not int8")
    if b.axis is not None:
        raise NotExact(f"{op}: per-channel right operand")
    constant_rhs = is_constant(node.args[ib]) and b.codes.ndim == 2
    lhs = torch.from_numpy((a.codes - int(a.zero_point)).astype(np.float64))
    rhs = torch.from_numpy((b.codes - int(b.zero_point)).astype(np.float64))
    acc = torch.matmul(lhs, rhs).round().to(torch.int64).numpy()
    acc_scale = float(a.scale) * float(b.scale)
    if addmm:
        bias = ref.operand(node.args[0])
        if isinstance(bias, Q):
            acc = acc + np.round(bias.codes * float(bias.scale) / acc_scale).astype(np.int64)
        elif isinstance(bias, np.ndarray):
            acc = acc + np.round(bias / acc_scale).astype(np.int64)
        else:
            raise NotExact("addmm bias is neither quantized nor a constant")
    if constant_rhs:  # FULLY_CONNECTED
        res = ti.fc_requantize(acc, acc_scale / out.scale)
    else:  # BATCH_MATMUL's Prepare multiplies the two scales in float32, then divides in double
        product = float(F32(a.scale) * F32(b.scale))
        m, s = ti.quantize_multiplier(product / out.scale)
        res = ti.multiply_by_quantized_multiplier(acc, m, s)
    return np.clip(res + out.zero_point, out.qmin, out.qmax)


def _reduce_extreme(ref: Reference, node: Node, out: Out) -> np.ndarray:
    """REDUCE_MAX / REDUCE_MIN: the extreme code, input and output sharing qparams."""
    x = ref._shared(node, out)
    rank = x.codes.ndim
    dims = tuple(sorted({int(d) % rank for d in (_arg(node, 1, "dim") or range(rank))}))
    keep = bool(_arg(node, 2, "keepdim", False))
    fn = np.max if node_op(node).startswith("aten.amax") else np.min
    return fn(x.codes, axis=dims, keepdims=keep)


def _mirror_pad(ref: Reference, node: Node, out: Out) -> np.ndarray:
    """MIRROR_PAD (REFLECT): the codes reflected, input and output sharing qparams."""
    mode = _arg(node, 2, "mode", "constant")
    if mode != "reflect":
        raise NotExact(f"pad mode {mode!r}")
    x = ref._shared(node, out)
    t = torch.from_numpy(x.codes.astype(np.float64))
    return torch.nn.functional.pad(t, list(node.args[1]), mode="reflect").round().long().numpy()


def _bilinear_axis(n_in: int, n_out: int, align: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ComputeInterpolationValuesInteger along one axis: (lower, upper, position in 1/1024)."""
    if align and n_out > 1:
        scale = ((1 << 10) * (n_in - 1) + (n_out - 1) // 2) // (n_out - 1)
        pos = np.arange(n_out, dtype=np.int64) * scale
    else:
        scale = ((1 << 10) * n_in + n_out // 2) // n_out
        pos = np.arange(n_out, dtype=np.int64) * scale + scale // 2 - (1 << 9)  # half-pixel centers
    lower = np.maximum(np.sign(pos) * (np.abs(pos) // (1 << 10)), 0)
    upper = np.minimum(np.sign(pos + 1023) * (np.abs(pos + 1023) // (1 << 10)), n_in - 1)
    return lower, upper, pos


def _bilinear(ref: Reference, node: Node, out: Out) -> np.ndarray:
    """RESIZE_BILINEAR (ResizeBilinearInteger): weights in 1/1024 steps, the 2^20-scaled sum
    divided with halves away from zero; codes in and out on one grid (half-pixel centers unless
    align_corners, as the converter sets them)."""
    x = ref._shared(node, out)
    if x.codes.ndim != 4:
        raise NotExact("bilinear resize of a non-4-D tensor")
    h_out, w_out = (int(d) for d in node.meta["val"].shape[-2:])
    align = bool(_arg(node, 2, "align_corners", False))
    y0, y1, py = _bilinear_axis(x.codes.shape[2], h_out, align)
    x0, x1, px = _bilinear_axis(x.codes.shape[3], w_out, align)
    dy, dx = (py - (1 << 10) * y0)[:, None], (px - (1 << 10) * x0)[None, :]
    c = x.codes
    total = (c[:, :, y0][:, :, :, x0] * ((1 << 10) - dy) * ((1 << 10) - dx)
             + c[:, :, y1][:, :, :, x0] * dy * ((1 << 10) - dx)
             + c[:, :, y0][:, :, :, x1] * ((1 << 10) - dy) * dx
             + c[:, :, y1][:, :, :, x1] * dy * dx)  # fmt: skip
    s = total + np.where(total > 0, 1 << 19, -(1 << 19))
    return np.sign(s) * (np.abs(s) // (1 << 20))


RULES: dict[str, Callable[[Reference, Node, Out], np.ndarray]] = {
    "aten._softmax.default": _softmax,
    "aten.softmax.int": _softmax,
    "aten.sigmoid.default": _sigmoid,
    "aten.tanh.default": _tanh,
    "aten.exp.default": _exp,
    "aten.log.default": _log,
    "aten.hardswish.default": _hardswish,
    "aten.leaky_relu.default": _leaky_relu,
    "aten.prelu.default": _prelu,
    "aten._prelu_kernel.default": _prelu,
    "aten.abs.default": _abs,
    "aten.rsqrt.default": _rsqrt,
    "aten.neg.default": _neg,
    "aten.mm.default": _matmul,
    "aten.bmm.default": _matmul,
    "aten.addmm.default": _matmul,
    "aten.matmul.default": _matmul,
    "aten.amax.default": _reduce_extreme,
    "aten.amin.default": _reduce_extreme,
    "aten.pad.default": _mirror_pad,
    "aten.upsample_bilinear2d.vec": _bilinear,
    "aten.upsample_bilinear2d.default": _bilinear,
}
