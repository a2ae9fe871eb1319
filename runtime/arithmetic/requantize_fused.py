"""A convolution's requantization in a few whole-tensor passes: int32 sums to int8 codes.

``tflite_int.requantize`` follows the kernels step by step (``SaturatingRoundingDoublingHighMul``,
then ``RoundingDivideByPOT``, then the zero point and the clamp), each step a new int64 array.
On a batch of activations that is most of the device simulation's time. The same integer
function, folded into one floor, runs here in place on one tensor:

With P = multiplier << left shift, E the right shift, D = 2^(31+E) and n = 1 where the first
rounding's result is negative: SaturatingRoundingDoublingHighMul(xP) = floor((xP + 2^30) / 2^31),
RoundingDivideByPOT adds 2^(E-1) - n and shifts by E, and a floor of a floor by powers of two
is one floor, so the code is

    clamp(floor((v·P + 2^30 + (2^(E-1) - n)·2^31) / D) + zero_point, qmin, qmax),  v = acc + bias.

``in_float64`` computes that in float64 where every term is exact (most layers; float64 passes
vectorize, int64 multiplies do not), ``in_int64`` in int64 elsewhere; each returns None where
its exactness conditions fail, and then the caller takes the step by step form.
``tests/test_device_ref.py`` holds both equal to it on edge and random values.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from etforge.runtime.arithmetic.tflite_int import multipliers

#: The int64 form's headroom: every intermediate stays below this magnitude.
_INT64_LIMIT = 2**62
#: The float64 form's largest right shift: |value| < 2^9 at a granularity of 2^-(31+E) is exact
#: in 53 bits while E <= 13 (see ``in_float64``).
_F64_MAX_SHIFT = 13
#: Past this distance from zero (before the zero point) every value clamps to the int8 range
#: (|zero point| <= 128, |qmin|, |qmax| <= 128, one more for the roundings).
_SATURATED = 258.0


def requantize_fused(
    acc: torch.Tensor, bound: int, bias: Any, real: Any, zero_point: int, qmin: int, qmax: int, axis: int
) -> torch.Tensor | None:
    """``clip(zero_point + tflite_int.requantize(acc + bias, real), qmin, qmax)`` as an int8
    tensor, or None where neither form is exact (module doc). ``acc``: exact integer sums (a
    float tensor, a temporary: it may be overwritten) with ``|acc| <= bound``; ``bias`` (int64)
    and ``real``: per channel along ``axis``, or one value; ``qmin >= -128``, ``qmax <= 127``."""
    return Requantizer(bias, real, zero_point, qmin, qmax)(acc, bound, axis)


class Requantizer:
    """``requantize_fused`` for one layer's constants (bias, multipliers, output grid): its
    per-channel terms computed once, for every batch the layer requantizes."""

    def __init__(self, bias: Any, real: Any, zero_point: int, qmin: int, qmax: int) -> None:
        self.terms = _terms(bias, real)
        self.zero_point, self.qmin, self.qmax = int(zero_point), int(qmin), int(qmax)
        self.float64 = _float64_terms(self.terms) if self.terms is not None else None
        self.shaped: dict[tuple[int, int], list[Any]] = {}
        self.unclamped: dict[int, bool] = {}  # accumulator bound -> ``_exact_unclamped``

    def __call__(self, acc: torch.Tensor, bound: int, axis: int) -> torch.Tensor | None:
        if self.terms is None:
            return None
        if self.float64 is not None:
            key = (acc.dim(), axis)
            if key not in self.shaped:
                self.shaped[key] = [_shaped(v, np.float64, acc.dim(), axis) for v in self.float64]
            exact = self.unclamped.get(bound)
            if exact is None:
                exact = self.unclamped[bound] = _exact_unclamped(self.terms, bound)
            return _apply_float64(
                acc, self.shaped[key], self.zero_point, self.qmin, self.qmax, clamp=not exact
            )
        return in_int64(acc, bound, self.terms, self.zero_point, self.qmin, self.qmax, axis)


def _terms(bias: Any, real: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Per channel: the bias, P (the Q31 multiplier times 2^left shift) and E (the right shift)."""
    m, shift = multipliers(np.asarray(real, np.float64).reshape(-1))
    channels = max(m.size, np.size(bias) if bias is not None else 1)
    m, shift = np.broadcast_to(m, (channels,)), np.broadcast_to(shift, (channels,))
    b = np.broadcast_to(np.asarray(0 if bias is None else bias, np.int64).reshape(-1), (channels,))
    left, right = np.maximum(shift, 0), np.maximum(-shift, 0)
    if int(right.max()) > 31 or int(left.max()) > 31:
        return None
    return b, m << left, right  # multipliers are in [0, 2^31)


def _shaped(values: np.ndarray | None, dtype: Any, rank: int, axis: int) -> Any:
    if values is None:
        return None
    shape = [1] * rank
    shape[axis] = values.size
    return torch.from_numpy(np.ascontiguousarray(values, dtype)).reshape(shape)


def in_float64(
    acc: torch.Tensor,
    terms: tuple[np.ndarray, np.ndarray, np.ndarray],
    zero_point: int,
    qmin: int,
    qmax: int,
    axis: int,
) -> torch.Tensor | None:
    """The fused form in float64, where it is exact: every P > 2^30 and every E <= 13.

    v = acc + bias is clamped to ±B, B = ceil(258·D / P): the code is monotone in v and at ±B
    already clamps to qmax / qmin, so the clamp changes no code. Then |v·P| <= 258·D + P <
    2^53: v·(P/D) is exact (P/D is P scaled by a power of two). With P > 2^30, n = 1 exactly
    where v < 0, and the numerator over D is v·P/D + 1/2 + zero_point ± 2^-(1+E) by the sign
    of v (0 at v = 0 gives the code zero_point either way; E = 0: no sign term). Each sum is a
    multiple of 2^-(31+E) below 2^9 in magnitude: 40 + E <= 53 bits, exact. The floor is the
    code."""
    consts = _float64_terms(terms)
    if consts is None:
        return None
    shaped = [_shaped(v, np.float64, acc.dim(), axis) for v in consts]
    return _apply_float64(acc, shaped, zero_point, qmin, qmax)


def _float64_terms(terms: tuple[np.ndarray, np.ndarray, np.ndarray]) -> list[np.ndarray | None] | None:
    """``in_float64``'s per-channel constants (bias, bound B, P/D, the sign term's 2^-(1+E);
    None for a bias or sign term that is zero everywhere), None where it is not exact."""
    b, prods, right = terms
    if int(prods.min()) <= 2**30 or int(right.max()) > _F64_MAX_SHIFT:
        return None
    scale = prods.astype(np.float64) / 2.0 ** (31 + right)  # exact: P times a power of two
    limit = np.ceil(_SATURATED / scale)
    if float((limit * prods).max()) >= 2.0**52:
        return None
    half_step = np.where(right > 0, 2.0 ** (-1.0 - right), 0.0)
    return [b.astype(np.float64) if np.any(b) else None, limit, scale, half_step if np.any(right) else None]


def _exact_unclamped(terms: tuple[np.ndarray, np.ndarray, np.ndarray], bound: int) -> bool:
    """``in_float64``'s sums are exact without its clamp to ±B for every |acc| <= ``bound``:
    with V = bound + |bias|, |v·P| <= V·P < 2^52 (an integer: v·(P/D) exact), and every sum
    after it, a multiple of 2^-(31+E), stays below 2^(22-E) in magnitude (53 bits):
    V·P/D + |0.5 + zero point| + 2^-(1+E) <= V·P/D + 130 (|zero point| <= 128) < 2^(22-E).
    The clamp changes no code (``in_float64``), so without it the codes are the same."""
    b, prods, right = terms
    reach = (float(bound) + np.abs(b).astype(np.float64)) * prods.astype(np.float64)
    if float(reach.max()) >= 2.0**52:
        return False
    return bool(np.all(reach / 2.0 ** (31 + right) + 131.0 < 2.0 ** (22 - right)))


def _apply_float64(
    acc: torch.Tensor, shaped: list[Any], zero_point: int, qmin: int, qmax: int, clamp: bool = True
) -> Any:
    """``in_float64``'s passes; ``clamp=False`` (``_exact_unclamped`` holds) leaves out the
    clamp to ±B, two of its passes."""
    bias, limit, scale, half_step = shaped
    v = acc.to(torch.float64)
    if bias is not None:
        v.add_(bias)
    if clamp:
        torch.minimum(v, limit, out=v)  # (a clamp to tensor bounds is several times slower)
        torch.maximum(v, -limit, out=v)
    sign = torch.clamp(v, -1, 1) if half_step is not None else None  # v is an integer: its sign
    v.mul_(scale).add_(0.5 + zero_point)
    if half_step is not None:
        v.addcmul_(sign, half_step)
    return v.floor_().clamp_(qmin, qmax).to(torch.int8)


def in_int64(
    acc: torch.Tensor,
    bound: int,
    terms: tuple[np.ndarray, np.ndarray, np.ndarray],
    zero_point: int,
    qmin: int,
    qmax: int,
    axis: int,
) -> torch.Tensor | None:
    """The fused form in int64, where every intermediate stays below 2^62 (``|acc| <= bound``):
    the bias and zero point fold into one constant per channel, n is where the running value
    is below the constant's own part of it, and a per-channel shift is one multiply and one
    shift (the spread of E at most 30)."""
    b, prods, right = terms
    top, low = int(right.max()), int(right.min())
    if top - low > 30:
        return None
    half = (np.int64(1) << right) >> 1
    worst = (float(bound) + np.abs(b).astype(np.float64)) * prods + 2.0 ** (31 + right) * (
        abs(zero_point) + 2
    )
    if float(worst.max()) >= _INT64_LIMIT / 2:  # checked in float64 with room for its rounding
        return None
    rank = acc.dim()
    zp_term = np.int64(zero_point) << (31 + right)
    consts = b * prods + (1 << 30) + (half << 31) + zp_term
    a = acc.to(torch.int64)
    a.mul_(_shaped(prods, np.int64, rank, axis)).add_(_shaped(consts, np.int64, rank, axis))
    if top:  # n: the first rounding's result is negative (only where a right shift follows)
        neg_below = np.where(right > 0, (half << 31) + zp_term, np.iinfo(np.int64).min)
        a.sub_(torch.lt(a, _shaped(neg_below, np.int64, rank, axis)).to(torch.int64), alpha=2**31)
    a.bitwise_right_shift_(31)
    if top == low:
        if top:
            a.bitwise_right_shift_(top)
    else:  # |a| < 2^31 here: the multiply stays below 2^61
        a.mul_(_shaped(np.int64(1) << (top - right), np.int64, rank, axis)).bitwise_right_shift_(top)
    return a.clamp_(qmin, qmax).to(torch.int8)
