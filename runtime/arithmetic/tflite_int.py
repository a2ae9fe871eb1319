"""TFLite's integer arithmetic, vectorized: the rounding primitives the device kernels use.

These are the building blocks of ``runtime.arithmetic.device_ref``. Each follows LiteRT's reference
kernels (``tensorflow/lite/kernels/internal/common.h`` and ``quantization_util.cc``): a real
multiplier becomes a Q31 fixed-point multiplier and a shift (``QuantizeMultiplier``), a
product is requantized with two roundings (``SaturatingRoundingDoublingHighMul`` then
``RoundingDivideByPOT``), and quantization parameters are float32, as the flatbuffer stores
them. ``tests/test_device_ref.py`` proves the ops built from them against LiteRT's reference
kernel interpreter (``OpResolverType.BUILTIN_REF``) bit for bit.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def f32(x: Any) -> Any:
    """A scale as the flatbuffer stores it (float32), back as a float64 array/scalar."""
    return np.asarray(x, np.float32).astype(np.float64)


def round_away(x: Any) -> Any:
    """``std::round`` / ``TfLiteRound``: halves away from zero (numpy rounds them to even)."""
    x = np.asarray(x)
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


def quantize_multiplier(real: float) -> tuple[int, int]:
    """``QuantizeMultiplier``: ``real`` = q / 2^31 * 2^shift with q in [2^30, 2^31)."""
    if real == 0.0:
        return 0, 0
    q, shift = math.frexp(real)
    q_fixed = int(round_away(q * (1 << 31)))
    if q_fixed == 1 << 31:
        q_fixed //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    if shift > 30:  # TFLite saturates; no int8 kernel gets here
        return INT32_MAX, 30
    return q_fixed, shift


def multipliers(reals: Any) -> tuple[np.ndarray, np.ndarray]:
    """``quantize_multiplier`` over an array (per-channel), as int64 arrays.

    Vectorized (``np.frexp``): verify computes it per op, per channel, per sample, and the
    element-by-element form was a tenth of verify's time. Each step is ``quantize_multiplier``'s
    on every element (``tests/test_device_ref.py`` holds the two equal)."""
    real = np.asarray(reals, np.float64)
    q, shift = np.frexp(real)
    q_fixed = round_away(q * float(1 << 31)).astype(np.int64)
    shift = np.asarray(shift, np.int64)
    top = q_fixed == 1 << 31
    q_fixed = np.where(top, q_fixed // 2, q_fixed)
    shift = np.where(top, shift + 1, shift)
    zero = (real == 0.0) | (shift < -31)
    high = ~zero & (shift > 30)  # TFLite saturates; no int8 kernel gets here
    q_fixed = np.where(zero, 0, np.where(high, INT32_MAX, q_fixed)).astype(np.int64)
    shift = np.where(zero, 0, np.where(high, 30, shift)).astype(np.int64)
    return q_fixed.reshape(np.shape(reals)), shift.reshape(np.shape(reals))


def srdhm(a: np.ndarray, b: Any) -> np.ndarray:
    """``SaturatingRoundingDoublingHighMul`` of int32 values (held in int64)."""
    a = np.asarray(a, np.int64)
    b = np.asarray(b, np.int64)
    # The nudge (2**30, or 1 - 2**30 below zero) then C's division by 2**31 toward zero is the
    # floor of (ab + 2**30) / 2**31 on both signs: one add and one arithmetic shift (in place
    # on the product: a large array's passes cost their memory traffic, a new one its pages too).
    out = a * b
    out += 1 << 30
    out >>= 31
    if np.any(b == INT32_MIN):  # the one product that saturates (multipliers never reach it)
        out = np.where((a == INT32_MIN) & (b == INT32_MIN), INT32_MAX, out)
    return out


def rounding_divide_by_pot(x: np.ndarray, exponent: Any) -> np.ndarray:
    """``RoundingDivideByPOT``: x / 2^exponent, halves away from zero."""
    return _divide_by_pot(np.array(x, np.int64), exponent)  # a copy: the caller's x is kept


def _divide_by_pot(v: np.ndarray, exponent: Any) -> np.ndarray:
    """``rounding_divide_by_pot`` computed in ``v``'s own memory (a temporary of the caller's)."""
    e = np.asarray(exponent, np.int64)
    # gemmlowp's form, (x >> e) + (x & mask > (mask >> 1) + (x < 0)), is adding half of 2^e
    # (one less below zero, where halves round down) and shifting (``tests/test_device_ref.py``
    # holds the two equal). numpy shifts by a per-channel array element by element, 7x slower
    # than by one count: x >> e is (x * 2^(top - e)) >> top, exact while the product fits.
    neg = (v < 0) if not np.any(e == 0) else (v < 0) & (e > 0)
    half = (np.int64(1) << e) >> 1
    if np.shape(v) != np.broadcast_shapes(np.shape(v), e.shape, neg.shape):
        v = np.array(np.broadcast_to(v, np.broadcast_shapes(np.shape(v), e.shape)), np.int64)
    v += half
    v -= neg
    top, low = (int(e.max()), int(e.min())) if e.size else (0, 0)
    if top == low:
        v >>= top
        return v
    if top - low <= 30 and low >= 0:  # |v| < 2^32: the product stays below 2^62
        v *= np.int64(1) << (top - e)
        v >>= top
        return v
    return v >> e


def multiply_by_quantized_multiplier(x: Any, multiplier: Any, shift: Any) -> np.ndarray:
    """``MultiplyByQuantizedMultiplier`` (two roundings; TFLITE_SINGLE_ROUNDING unset)."""
    shift = np.asarray(shift, np.int64)
    left = np.where(shift > 0, shift, 0)
    right = np.where(shift > 0, 0, -shift)
    x = np.asarray(x, np.int64)
    if np.any(left):
        x = x * (np.int64(1) << left)
    return _divide_by_pot(np.asarray(srdhm(x, multiplier)), right)


def mul_multiplier(s1: float, s2: float, s_out: float) -> float:
    """MUL's real multiplier as its Prepare computes it: the float32 scales multiplied and
    divided in float32 (not double), which moves the Q31 multiplier on some qparams."""
    return float(np.float32(s1) * np.float32(s2) / np.float32(s_out))


def fc_requantize(acc: Any, real: Any) -> np.ndarray:
    """FULLY_CONNECTED's int8 output step as LiteRT computes it: the accumulator times the
    double multiplier, halves away from zero. Neither MBQM form (one or two roundings of a
    Q31 multiplier) matches it on every accumulator; this does (``tests/test_device_ref.py``)."""
    return round_away(np.asarray(acc, np.int64) * np.asarray(real, np.float64)).astype(np.int64)


def requantize(acc: Any, real: Any) -> np.ndarray:
    """int32 accumulators scaled by ``real`` (scalar or broadcastable per-channel array)."""
    m, s = multipliers(real)
    return multiply_by_quantized_multiplier(acc, m, s)


def quantize_value(value: float, scale: float, zero_point: int) -> int:
    """A real bound on the output grid as the kernels compute it (float32, round away)."""
    return int(zero_point + round_away(np.float32(value) / np.float32(scale)))


def divide_round_away(acc: np.ndarray, count: Any) -> np.ndarray:
    """``acc > 0 ? (acc + n/2) / n : (acc - n/2) / n`` in C integer arithmetic."""
    acc = np.asarray(acc, np.int64)
    n = np.asarray(count, np.int64)
    return np.sign(acc) * ((np.abs(acc) + n // 2) // n)
