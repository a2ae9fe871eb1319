"""gemmlowp's fixed-point arithmetic, vectorized: what TFLite's integer softmax, rsqrt and
hard-swish kernels compute with.

A ``FixedPoint<int32, k>`` value is its raw int32 (held in int64 arrays here) with ``k``
integer bits; a product of two is ``SaturatingRoundingDoublingHighMul`` of the raws, a
rescale is a rounding or saturating power-of-two shift. The polynomial and Newton-Raphson
constants are gemmlowp's (``fixedpoint.h``); the functions follow its algorithms step for
step, since one rounding placed differently changes the last bit the device produces.
``tests/test_device_ref.py`` proves the kernels built from them against LiteRT bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from etforge.runtime.arithmetic.tflite_int import INT32_MAX, INT32_MIN, rounding_divide_by_pot, srdhm

INT16_MIN, INT16_MAX = -(2**15), 2**15 - 1

__all__ = [
    "INT16_MAX",
    "INT16_MIN",
    "count_leading_zeros",
    "exp_on_negative_values",
    "inv_sqrt_multiplier",
    "one_over_one_plus_x",
    "reciprocal",
    "rounding_divide_by_pot",
    "saturating_shift_left",
    "srdhm",
    "srdhm16",
]


def _i64(x: Any) -> np.ndarray:
    return np.asarray(x, np.int64)


def saturating_shift_left(x: Any, exponent: int, lo: int = INT32_MIN, hi: int = INT32_MAX) -> np.ndarray:
    """``SaturatingRoundingMultiplyByPOT<exponent>`` for exponent >= 0: x * 2^e, saturated."""
    return np.clip(_i64(x) << exponent, lo, hi)


def rescale(x: Any, src_bits: int, dst_bits: int) -> np.ndarray:
    """``Rescale<dst_bits>`` of a ``FixedPoint<int32, src_bits>`` raw."""
    e = src_bits - dst_bits
    return saturating_shift_left(x, e) if e >= 0 else rounding_divide_by_pot(x, -e)


def srdhm16(a: Any, b: Any) -> np.ndarray:
    """``SaturatingRoundingDoublingHighMul`` of int16 values."""
    a, b = _i64(a), _i64(b)
    ab = a * b
    nudge = np.where(ab >= 0, 1 << 14, 1 - (1 << 14))
    s = ab + nudge
    out = np.sign(s) * (np.abs(s) // (1 << 15))  # C division: toward zero
    return np.where((a == INT16_MIN) & (b == INT16_MIN), INT16_MAX, out)


def _exp_quarter(a: np.ndarray) -> np.ndarray:
    """exp(a) for a in [-1/4, 0) (Q0.31): a Taylor expansion around -1/8."""
    constant_term, one_third = 1895147668, 715827883  # exp(-1/8), 1/3 in Q0.31
    x = a + (1 << 28)  # a + 1/8
    x2 = srdhm(x, x)
    x3 = srdhm(x2, x)
    x4 = srdhm(x2, x2)
    x4_over_4 = rounding_divide_by_pot(x4, 2)
    poly = rounding_divide_by_pot(srdhm(x4_over_4 + x3, one_third) + x2, 1)
    return constant_term + srdhm(constant_term, x + poly)


#: exp(-2^k) in Q0.31 for k = -2 .. 4: the barrel shifter of exp_on_negative_values.
_EXP_BARREL = ((-2, 1672461947), (-1, 1302514674), (0, 790015084), (1, 290630308),
               (2, 39332535), (3, 720401), (4, 242))  # fmt: skip


def exp_on_negative_values(a: Any, integer_bits: int) -> np.ndarray:
    """``exp_on_negative_values``: exp of a ``FixedPoint<int32, integer_bits>`` <= 0, in Q0.31."""
    a = _i64(a)
    frac = 31 - integer_bits
    quarter = 1 << (frac - 2)
    mod = (a & (quarter - 1)) - quarter  # in [-1/4, 0)
    result = _exp_quarter(rescale(mod, integer_bits, 0))
    remainder = mod - a
    for exponent, multiplier in _EXP_BARREL:
        if integer_bits > exponent:
            bit = (remainder & (np.int64(1) << (frac + exponent))) != 0
            result = np.where(bit, srdhm(result, multiplier), result)
    if integer_bits > 5:
        result = np.where(a < -(np.int64(1) << (36 - integer_bits)), 0, result)
    return np.where(a == 0, INT32_MAX, result)


def _rounding_half_sum(a: np.ndarray, b: int) -> np.ndarray:
    s = a + b
    s = s + np.where(s >= 0, 1, -1)
    return np.sign(s) * (np.abs(s) // 2)


def one_over_one_plus_x(a: Any) -> np.ndarray:
    """``one_over_one_plus_x_for_x_in_0_1``: 1 / (1 + a) for a Q0.31 ``a`` in [0, 1), Q0.31."""
    half_denominator = _rounding_half_sum(_i64(a), INT32_MAX)
    x = 1515870810 + srdhm(half_denominator, -1010580540)  # 48/17 - 32/17 * d, Q2.29
    for _ in range(3):
        one_minus = (1 << 29) - srdhm(half_denominator, x)
        x = x + rescale(srdhm(x, one_minus), 4, 2)
    return rescale(x, 1, 0)  # ExactMulByPot<-1> keeps the raw: Q1.30 -> Q0.31


def count_leading_zeros(x: Any) -> np.ndarray:
    """Leading zero bits of non-negative int32 values (32 for 0)."""
    x = _i64(x)
    bits = np.zeros(x.shape, np.int64)
    v = x.copy()
    for _ in range(32):
        nz = v > 0
        bits = bits + nz
        v = v >> 1
    return 32 - bits


def reciprocal(x: Any, integer_bits: int) -> tuple[np.ndarray, np.ndarray]:
    """``GetReciprocal``: (1 / x as Q0.31 of x scaled into [1, 2), num_bits_over_unit)."""
    x = _i64(x)
    headroom_plus_one = count_leading_zeros(x)
    bits_over_unit = integer_bits - headroom_plus_one
    shifted = ((x << headroom_plus_one) & 0xFFFFFFFF) - (1 << 31)
    return one_over_one_plus_x(shifted), bits_over_unit


def inv_sqrt_multiplier(x: int, reverse_shift: int) -> tuple[int, int]:
    """``GetInvSqrtQuantizedMultiplierExp`` of one int32 ``x`` >= 0: 1/sqrt(x) as a multiplier
    and shift (Newton-Raphson in Q3.28, five iterations from 1)."""
    if x <= 1:
        return INT32_MAX, 0
    shift = 11
    while x >= 1 << 29:
        x //= 4
        shift += 1
    pairs = (int(count_leading_zeros(x)) - 1) // 2 - 1
    shift -= pairs
    x <<= 2 * pairs
    f_in = _i64(x >> 1)
    half_in = rounding_divide_by_pot(f_in, 1)
    half_three = (1 << 28) + (1 << 27)
    v = _i64(1 << 28)
    for _ in range(5):
        v3 = rescale(srdhm(srdhm(v, v), v), 9, 3)
        v = rescale(srdhm(half_three, v) - srdhm(half_in, v3), 6, 3)
    raw = int(srdhm(v, 1518500250))  # * sqrt(2)/2
    if shift < 0:
        raw <<= -shift
        shift = 0
    return raw, shift * reverse_shift
