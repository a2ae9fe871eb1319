"""Host kernels for the ``cortex_m::`` operators, integer for integer what the device computes.

The Cortex-M CPU backend's host arithmetic (``CortexMBackend.host_arithmetic``): ``verify`` asks
the backend for it and never names this module.

On the device each ``cortex_m`` op is ExecuTorch's C++ wrapper (``backends/cortex_m/ops``) around a
CMSIS-NN function; ExecuTorch's Python reference implementations of the same ops compute in float
and round half to even where CMSIS-NN rounds half away from zero (average pooling, division), and
go through float for softmax, so they differ from the device by one step. These kernels follow the
C code instead — ``arm_nn_requantize`` (doubling high multiply, then a rounding right shift),
``arm_avgpool_s8`` (integer sum, rounded division by the valid count), ``arm_softmax_s8`` (gemmlowp
fixed-point exp and reciprocal), the wrappers' float32 quantize/dequantize — and are vectorized with
torch (no Python loop per element). ``tests/test_cortex_m_kernels.py`` proves them bit-exact
against CMSIS-NN's C built for the host.

Memory is read as the C code reads it: each kernel takes a tensor's bytes in memory order (its raw
buffer) with the dims the wrapper derives, so a layout the device would misread is misread here too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1
#: float32 sums of integer products are exact while every partial sum stays below 2**24.
_F32_EXACT = 2**24


# -- memory ------------------------------------------------------------------------------------


def dense(t: torch.Tensor) -> bool:
    """The tensor covers exactly ``numel`` consecutive elements of its storage, in some order."""
    dims = sorted((st, sz) for st, sz in zip(t.stride(), t.shape, strict=True) if sz != 1)
    expected = 1
    for st, sz in dims:
        if st != expected:
            return False
        expected *= sz
    return True


def raw(t: torch.Tensor) -> torch.Tensor:
    """The tensor's elements in memory order, as a 1-D tensor (a view when it is dense)."""
    if not dense(t):
        t = t.contiguous()
    return torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), t.storage_offset(), (t.numel(),), (1,))


def write_raw(out: torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    """Store ``flat`` (memory order) into ``out``'s bytes; returns ``out``."""
    if flat.numel() != out.numel():
        raise RuntimeError(f"the kernel produced {flat.numel()} values, the output holds {out.numel()}")
    if dense(out):
        raw(out).copy_(flat.reshape(-1))
    else:  # not a device layout; store in logical order
        out.copy_(flat.reshape(out.shape))
    return out


def _nhwc(t: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int, int]]:
    """A 4-D NCHW tensor's bytes as CMSIS-NN reads them: [N, H, W, C]. The wrappers require
    channels-last inputs; a host caller's contiguous tensor is brought to that layout."""
    n, c, h, w = (int(s) for s in t.shape)
    if not _is_channels_last(t):
        t = t.contiguous(memory_format=torch.channels_last)
    return raw(t).view(n, h, w, c), (n, h, w, c)


def _like(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``x`` in ``out``'s memory layout, so an elementwise kernel can pair their raw buffers
    (on the device both share the program's dim order; a host caller's input may not)."""
    if tuple(x.shape) != tuple(out.shape) or x.stride() == out.stride() or not dense(out):
        return x
    y = torch.empty_strided(tuple(out.shape), out.stride(), dtype=x.dtype)
    return y.copy_(x)


def _nhwc_explicit(t: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int, int, int]]:
    """The ``*_nhwc`` ops' input: logical [N, H, W, C]."""
    n, h, w, c = (int(s) for s in t.shape)
    return raw(t).view(n, h, w, c), (n, h, w, c)


# -- int32 arithmetic --------------------------------------------------------------------------


def wrap32(x: torch.Tensor) -> torch.Tensor:
    """int64 values reduced to int32 two's complement (C's conversion on the device)."""
    return ((x + 2**31) & (2**32 - 1)) - 2**31


def requantize(acc: torch.Tensor, multiplier: Any, shift: Any, bound: int | None = None) -> torch.Tensor:
    """``arm_nn_requantize`` (int64 in, int64 out): ``multiplier``/``shift`` broadcast against ``acc``.

    ``val * (1 << LEFT_SHIFT(shift))`` in int32, ``arm_nn_doubling_high_mult_no_sat`` (+2^30, >> 31,
    truncated to int32), then ``arm_nn_divide_by_power_of_two`` (rounding half away from zero).
    ``bound``: a known bound on ``|acc|`` (saves two passes over it).
    """
    m = torch.as_tensor(multiplier, dtype=torch.int64)
    s = torch.as_tensor(shift, dtype=torch.int64)
    acc = acc.to(torch.int64)
    if bound is None and acc.numel():
        bound = max(-int(acc.min()), int(acc.max()))
    if bool((s <= 0).all()) and bool((m >= 0).all()) and (bound or 0) <= _I32_MAX:
        # the common case, in fewer passes: no left shift, and no int32 overflow is possible
        # (|acc * m| < 2^62, so the doubling high multiply stays inside int32)
        e = -s
        half = (torch.ones_like(e) << e) >> 1
        r = (acc * m + (1 << 30)) >> 31
        return (r + half + (r >> 63) * (e > 0).to(torch.int64)) >> e
    left = s.clamp(min=0)
    right = (-s).clamp(min=0)
    v = wrap32(acc << left)
    r = wrap32((v * m + (1 << 30)) >> 31)
    return divide_by_pow2(r, right)


def divide_by_pow2(x: torch.Tensor, exponent: Any) -> torch.Tensor:
    """``arm_nn_divide_by_power_of_two``: arithmetic shift rounded half away from zero."""
    e = torch.as_tensor(exponent, dtype=torch.int64)
    mask = (torch.ones_like(e) << e) - 1
    remainder = x & mask
    result = x >> e
    threshold = (mask >> 1) + (result < 0).to(torch.int64)
    return result + (remainder > threshold).to(torch.int64)


def _doubling_high_mult(a: torch.Tensor, b: Any) -> torch.Tensor:
    """``arm_nn_doubling_high_mult`` (MUL_SAT): rounded, truncating division, saturating."""
    b = torch.as_tensor(b, dtype=torch.int64)
    nudge = torch.where((a < 0) ^ (b < 0), 1 - (1 << 30), 1 << 30)
    prod = a * b + nudge
    result = torch.div(prod, 1 << 31, rounding_mode="trunc")
    overflow = (a == _I32_MIN) & (b == _I32_MIN)
    return wrap32(torch.where(overflow, torch.full_like(result, _I32_MAX), result))


def _mult_by_pow2(x: torch.Tensor, exp: int) -> torch.Tensor:
    """``arm_nn_mult_by_power_of_two`` (MUL_POW2): saturating left shift."""
    thresh = (1 << (31 - exp)) - 1
    result = wrap32(x << exp)
    result = torch.where(x > thresh, torch.full_like(result, _I32_MAX), result)
    return torch.where(x < -thresh, torch.full_like(result, _I32_MIN), result)


def _exp_on_negative_values(val: torch.Tensor) -> torch.Tensor:
    """``arm_nn_exp_on_negative_values`` (gemmlowp's exp on [-inf, 0] in Q5.26 -> Q0.31)."""
    shift = 24
    val_mod_minus_quarter = (val & ((1 << shift) - 1)) - (1 << shift)
    remainder = wrap32(val_mod_minus_quarter - val)
    x = wrap32((val_mod_minus_quarter << 5) + (1 << 28))
    x2 = _doubling_high_mult(x, x)
    inner = wrap32(divide_by_pow2(_doubling_high_mult(x2, x2), 2) + _doubling_high_mult(x2, x))
    inner = wrap32(_doubling_high_mult(inner, 715827883) + x2)
    result = wrap32(
        1895147668 + _doubling_high_mult(torch.full_like(x, 1895147668), wrap32(x + divide_by_pow2(inner, 1)))
    )
    for constant in (1672461947, 1302514674, 790015084, 290630308, 39332535, 720401, 242):
        select = (remainder & (1 << shift)) != 0
        result = torch.where(select, _doubling_high_mult(result, constant), result)
        shift += 1
    return torch.where(val == 0, torch.full_like(result, _I32_MAX), result)


def _one_over_one_plus_x(val: torch.Tensor) -> torch.Tensor:
    """``arm_nn_one_over_one_plus_x_for_x_in_0_1`` (Newton-Raphson reciprocal, Q0.31)."""
    total = val + _I32_MAX
    half_den = wrap32(torch.div(total + torch.where(total >= 0, 1, -1), 2, rounding_mode="trunc"))
    x = wrap32(1515870810 + _doubling_high_mult(half_den, -1010580540))
    one = 1 << 29
    for _ in range(3):
        x = wrap32(
            x + _mult_by_pow2(_doubling_high_mult(x, wrap32(one - _doubling_high_mult(half_den, x))), 2)
        )
    return _mult_by_pow2(x, 1)


def _clz32(x: torch.Tensor) -> torch.Tensor:
    """``CLZ`` of non-negative int32 values (32 for 0): from the float64 exponent, exact here."""
    _, exp = torch.frexp(x.to(torch.float64))
    return torch.where(x > 0, 32 - exp.to(torch.int64), torch.full_like(x, 32))


def _clamp_i8(x: torch.Tensor, lo: int = -128, hi: int = 127) -> torch.Tensor:
    return x.clamp(lo, hi).to(torch.int8)


# -- integer convolution -----------------------------------------------------------------------


def _absmax(t: torch.Tensor) -> int:
    """max |t| without overflow (``abs`` of int8 -128 stays -128)."""
    if not t.numel():
        return 0
    lo, hi = torch.aminmax(t)
    return max(abs(int(lo)), abs(int(hi)))


def _exact_float(bound: float) -> torch.dtype:
    return torch.float32 if bound < _F32_EXACT else torch.float64


def _int_conv(
    x: torch.Tensor,
    w: torch.Tensor,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
    transposed: bool = False,
    output_padding: Sequence[int] = (0, 0),
) -> tuple[torch.Tensor, int]:
    """Integer NCHW convolution (int64 result, and a bound on its magnitude) through float:
    float32 when every partial sum is provably below 2**24 (exact), float64 otherwise (exact
    below 2**53)."""
    k = (w.shape[0] // groups if transposed else w.shape[1]) * w.shape[2] * w.shape[3]
    bound = _absmax(x) * _absmax(w) * k
    dt = _exact_float(bound)
    if transposed:
        y = F.conv_transpose2d(
            x.to(dt),
            w.to(dt),
            None,
            stride=tuple(stride),
            padding=tuple(padding),
            output_padding=tuple(output_padding),
            groups=groups,
            dilation=tuple(dilation),
        )
    else:
        y = F.conv2d(x.to(dt), w.to(dt), None, tuple(stride), tuple(padding), tuple(dilation), groups)
    return y.to(torch.int64), bound  # integral already: the conversion is exact


def _int_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Integer ``a @ b`` (int64) through float, exact as in ``_int_conv``."""
    dt = _exact_float(_absmax(a) * _absmax(b) * a.shape[-1])
    return torch.matmul(a.to(dt), b.to(dt)).to(torch.int64)


def _finish(
    acc: torch.Tensor,
    mult: Any,
    shift: Any,
    out_offset: int,
    lo: int,
    hi: int,
    bound: int | None = None,
    owned: bool = False,
) -> torch.Tensor:
    """Requantize, add the output offset, clamp: the tail of every CMSIS-NN int8 MAC kernel
    (``acc`` wraps to int32 first, as the C accumulator does). ``owned``: ``acc`` is an int64
    tensor of the caller's own that may be overwritten (the common case then runs in place)."""
    if bound is None or bound > _I32_MAX:
        acc, bound, owned = wrap32(acc), None, True
    if owned and acc.dtype == torch.int64:
        done = _requantize_in_place(acc, mult, shift, bound)
        if done is not None:
            return done.add_(out_offset).clamp_(lo, hi).to(torch.int8)
    return _clamp_i8(requantize(acc, mult, shift, bound) + out_offset, lo, hi)


@dataclass(frozen=True)
class _Channels:
    """A MAC kernel's per-channel bias and requantization constants as the paths below use them
    (derived once per distinct content: a program's convolutions repeat them every sample)."""

    bias: torch.Tensor | None  # int64 [1, C, 1, 1]
    bias_f64: torch.Tensor | None
    bias_absmax: int
    m: torch.Tensor  # int64 [1, C, 1, 1]
    s: torch.Tensor
    m_f64: torch.Tensor
    m_high: torch.Tensor  # m >> 16 and m & 0xFFFF, float64: the split multiply
    m_low: torch.Tensor
    e32: torch.Tensor  # -s, int32
    half32: torch.Tensor  # (1 << e) >> 1, int32
    e_positive32: torch.Tensor | None  # None: every e > 0
    m_max: int
    m_min: int
    right_shifts_only: bool
    half_max: int


_CHANNELS: dict[tuple[Any, ...], _Channels] = {}


def _content(t: torch.Tensor | None) -> tuple[Any, ...]:
    if t is None:
        return (None,)
    flat = t if t.dim() == 1 and t.stride(0) == 1 else raw(t)  # a 1-D constant: its own memory order
    return (t.dtype, tuple(t.shape), flat.numpy().tobytes())


def _channels(bias: torch.Tensor | None, mults: torch.Tensor, shifts: torch.Tensor, c: int) -> _Channels:
    """``_Channels`` of these tensors' values (keyed by their bytes: equal content, equal constants)."""
    key = (c, *_content(bias), *_content(mults), *_content(shifts))
    found = _CHANNELS.get(key)
    if found is not None:
        return found
    b = raw(bias).to(torch.int64).view(1, -1, 1, 1) if bias is not None else None
    m = raw(mults).to(torch.int64)[:c].view(1, -1, 1, 1)
    s = raw(shifts).to(torch.int64)[:c].view(1, -1, 1, 1)
    e = -s
    half = (torch.ones_like(e) << e) >> 1
    found = _Channels(
        bias=b,
        bias_f64=b.to(torch.float64) if b is not None else None,
        bias_absmax=_absmax(b) if b is not None else 0,
        m=m,
        s=s,
        m_f64=m.to(torch.float64),
        m_high=(m >> 16).to(torch.float64),
        m_low=(m & 0xFFFF).to(torch.float64),
        e32=e.to(torch.int32),
        half32=half.to(torch.int32),
        e_positive32=None if bool((e > 0).all()) else (e > 0).to(torch.int32),
        m_max=int(m.max()) if m.numel() else 0,
        m_min=int(m.min()) if m.numel() else 0,
        right_shifts_only=bool((s <= 0).all()),
        half_max=int(half.max()) if half.numel() else 0,
    )
    if len(_CHANNELS) >= 4096:  # bounded: a long-running process sees many programs
        _CHANNELS.clear()
    _CHANNELS[key] = found
    return found


def _finish_exact_float(
    y: torch.Tensor, ch: _Channels, out_offset: int, lo: int, hi: int, bound: int
) -> torch.Tensor | None:
    """``_finish`` of ``y + bias`` (``y``: a float convolution result holding integers, the
    caller's own; ``|y + bias| <= bound``) in fewer, narrower passes, the same integers; None
    outside the case where every step below is exact (then the integer path runs).

    ``requantize``'s common case — no left shift, ``r = (acc * m + 2^30) >> 31``, then
    ``(r + half + (r < 0 and e > 0 ? -1 : 0)) >> e`` — with the first step in float64 (every
    intermediate an integer below 2^53, scaled by a power of two: exact; ``floor`` is the
    arithmetic shift) and the rest in int32 (``|r| + half + |out_offset|`` below 2^31: no
    overflow). Where ``acc * m`` may reach 2^53 the multiplier is split, ``m = h * 2^16 + l``:
    ``r = floor((acc * h + floor((acc * l + 2^30) / 2^16)) / 2^15)``, each term below 2^48
    (``floor((n + d) / k) = floor(n / k)`` for integers ``n``, ``k`` and ``0 <= d < 1``).
    """
    if not (
        bound <= _I32_MAX
        and ch.right_shifts_only
        and ch.m_min >= 0
        and ((bound * ch.m_max + (1 << 30)) >> 31) + 1 + ch.half_max + abs(out_offset) < _I32_MAX
    ):
        return None
    t = y.to(torch.float64)
    if ch.bias_f64 is not None:
        t.add_(ch.bias_f64)
    if bound * ch.m_max + (1 << 30) < 2**53:
        t.mul_(ch.m_f64).add_(float(1 << 30)).mul_(2.0**-31).floor_()
    else:  # |acc| < 2^31: acc * h < 2^46, acc * l + 2^30 < 2^48
        high = t * ch.m_high
        t.mul_(ch.m_low).add_(float(1 << 30)).mul_(2.0**-16).floor_()
        t = high.add_(t).mul_(2.0**-15).floor_()
    r = t.to(torch.int32)
    negative = r >> 31  # -1 where negative: half away from zero, as divide_by_power_of_two
    if ch.e_positive32 is not None:
        negative.mul_(ch.e_positive32)
    r.add_(negative).add_(ch.half32).bitwise_right_shift_(ch.e32)
    return r.add_(out_offset).clamp_(lo, hi).to(torch.int8)


def _requantize_in_place(
    acc: torch.Tensor, multiplier: Any, shift: Any, bound: int | None
) -> torch.Tensor | None:
    """``requantize``'s common case (no left shift, no int32 overflow) computed in ``acc``'s own
    memory, the same integers in fewer passes; None (``acc`` untouched) outside that case."""
    m = torch.as_tensor(multiplier, dtype=torch.int64)
    s = torch.as_tensor(shift, dtype=torch.int64)
    if bound is None and acc.numel():
        bound = max(-int(acc.min()), int(acc.max()))
    if not (bool((s <= 0).all()) and bool((m >= 0).all()) and (bound or 0) <= _I32_MAX):
        return None
    e = -s
    half = (torch.ones_like(e) << e) >> 1
    acc.mul_(m).add_(1 << 30).bitwise_right_shift_(31)  # arm_nn_doubling_high_mult_no_sat
    negative = acc >> 63  # -1 where negative: half away from zero, as divide_by_power_of_two
    if not bool((e > 0).all()):
        negative.mul_((e > 0).to(torch.int64))
    return acc.add_(negative).add_(half).bitwise_right_shift_(e)


def _conv(
    x: torch.Tensor,
    dims: tuple[int, int, int, int],
    weight_ohwi: torch.Tensor,
    bias: torch.Tensor | None,
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    groups: int,
    input_offset: int,
    output_offset: int,
    mults: torch.Tensor,
    shifts: torch.Tensor,
    lo: int,
    hi: int,
) -> torch.Tensor:
    """Shared body of ``arm_convolve_wrapper_s8`` / ``arm_depthwise_conv_wrapper_s8``: returns NHWC int8."""
    xi = x.permute(0, 3, 1, 2)  # channels-last memory
    w = weight_ohwi.permute(0, 3, 1, 2)
    # _int_conv on x + input_offset, its bound from the int8 extremes (x + offset is monotone)
    x_abs = 0
    if xi.numel():
        x_lo, x_hi = (int(v) for v in torch.aminmax(xi))
        x_abs = max(abs(x_lo + input_offset), abs(x_hi + input_offset))
    bound = x_abs * _absmax(w) * int(w.shape[1] * w.shape[2] * w.shape[3])
    dt = _exact_float(bound)
    xin = xi.to(dt).add_(input_offset)  # small integers: exact in either float
    y = F.conv2d(xin, w.to(dt), None, tuple(stride), tuple(padding), tuple(dilation), groups)
    ch = _channels(bias, mults, shifts, int(y.shape[1]))
    bound += ch.bias_absmax
    res = _finish_exact_float(y, ch, output_offset, lo, hi, bound)
    if res is None:  # outside the case it covers: the integer path
        acc = y.to(torch.int64)
        if ch.bias is not None:
            acc.add_(ch.bias)
        res = _finish(acc, ch.m, ch.s, output_offset, lo, hi, bound, owned=True)
    return res.permute(0, 2, 3, 1)


# -- the operators (out variants, schema argument order) ---------------------------------------


def quantize_per_tensor(
    input: torch.Tensor,
    scale: float,
    zero_point: int,
    quant_min: int,
    quant_max: int,
    dtype: Any,
    out: torch.Tensor,
) -> torch.Tensor:
    """``op_quantize_per_tensor.cpp``: ``zp + (int32_t)nearbyint(x * (1.0f / (float)scale))`` in float32.

    The C++ cast is undefined beyond int32; the M33's ``VCVT`` saturates (NaN gives 0), so an
    inf or NaN reaching the CPU (a float division by zero upstream) quantizes as it does there.
    """
    inv = np.float32(1.0) / np.float32(scale)
    x = raw(_like(input, out)).to(torch.float32).numpy()
    with np.errstate(invalid="ignore", over="ignore"):
        r = np.nan_to_num(np.rint(x * inv).astype(np.float64), nan=0.0, posinf=_I32_MAX, neginf=_I32_MIN)
    q = np.clip(r, _I32_MIN, _I32_MAX).astype(np.int64) + int(zero_point)
    q = np.clip(q, quant_min, quant_max)
    return write_raw(out, torch.from_numpy(q).to(out.dtype))


def dequantize_per_tensor(
    input: torch.Tensor,
    scale: float,
    zero_point: int,
    quant_min: int,
    quant_max: int,
    dtype: Any,
    out: torch.Tensor,
) -> torch.Tensor:
    """``op_dequantize_per_tensor.cpp``: ``(float)(q - zp) * (float)scale`` in float32."""
    q = raw(_like(input, out)).to(torch.int32) - int(zero_point)
    return write_raw(out, q.to(torch.float32) * torch.tensor(np.float32(scale)))


def _broadcast_pair(
    a: torch.Tensor, b: torch.Tensor, out: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The wrappers' channel broadcast: the larger operand's raw bytes in chunks of C, each
    combined with the channels-only operand; returns (big, small, swapped)."""
    ra, rb = raw(_like(a, out)), raw(_like(b, out))
    if ra.numel() == rb.numel():
        return ra, rb, False
    if ra.numel() < rb.numel():
        c = int(b.shape[1])
        return rb.view(-1, c), ra.view(1, c), True
    c = int(a.shape[1])
    return ra.view(-1, c), rb.view(1, c), False


def quantized_add(
    self: torch.Tensor,
    self_zero_point: int,
    self_multiplier: int,
    self_shift: int,
    other: torch.Tensor,
    other_zero_point: int,
    other_multiplier: int,
    other_shift: int,
    output_zero_point: int,
    output_multiplier: int,
    output_shift: int,
    activation_min: int,
    activation_max: int,
    out: torch.Tensor,
) -> torch.Tensor:
    """``arm_elementwise_add_s8`` with the wrapper's left shift of 20."""
    params = [
        (self_zero_point, self_multiplier, self_shift),
        (other_zero_point, other_multiplier, other_shift),
    ]
    x1, x2, swapped = _broadcast_pair(self, other, out)
    if swapped:
        params.reverse()
    (z1, m1, s1), (z2, m2, s2) = params
    a = _requantize_scalar((x1.to(torch.int64) - z1) << 20, m1, s1, (128 + abs(z1)) << 20)
    b = _requantize_scalar((x2.to(torch.int64) - z2) << 20, m2, s2, (128 + abs(z2)) << 20)
    if a is None or b is None:  # requantize's general case
        a = requantize(wrap32((x1.to(torch.int64) - z1) << 20), m1, s1)
        b = requantize(wrap32((x2.to(torch.int64) - z2) << 20), m2, s2)
    a.add_(b)
    total = _requantize_scalar(a, output_multiplier, output_shift, _I32_MAX + 1)
    if total is None:
        total = requantize(wrap32(a), output_multiplier, output_shift)
    total.add_(output_zero_point)
    return write_raw(out, _clamp_i8(total, activation_min, activation_max))


def _requantize_scalar(acc: torch.Tensor, multiplier: int, shift: int, bound: int) -> torch.Tensor | None:
    """``requantize`` with one multiplier and shift, in ``acc``'s own memory (int64, the caller's,
    ``|acc| <= bound``): its common case (no left shift, no int32 overflow), the same integers in
    fewer operations; None (``acc`` untouched) otherwise, and when ``acc`` may exceed int32
    (the general case wraps it first)."""
    multiplier, shift = int(multiplier), int(shift)
    if shift > 0 or multiplier < 0:
        return None
    if bound > _I32_MAX:  # the sum of two requantized values: measure it
        if acc.numel() and max(-int(acc.min()), int(acc.max())) > _I32_MAX:
            return None
    e = -shift
    acc.mul_(multiplier).add_(1 << 30).bitwise_right_shift_(31)  # arm_nn_doubling_high_mult_no_sat
    if e > 0:  # arm_nn_divide_by_power_of_two: half away from zero
        acc.add_(acc >> 63).add_((1 << e) >> 1).bitwise_right_shift_(e)
    return acc


def quantized_mul(
    self: torch.Tensor,
    self_zero_point: int,
    other: torch.Tensor,
    other_zero_point: int,
    output_zero_point: int,
    output_multiplier: int,
    output_shift: int,
    out: torch.Tensor,
) -> torch.Tensor:
    """``arm_elementwise_mul_s8`` (activation -128..127, as the wrapper passes)."""
    zps = [self_zero_point, other_zero_point]
    x1, x2, swapped = _broadcast_pair(self, other, out)
    if swapped:
        zps.reverse()
    prod = (x1.to(torch.int64) - zps[0]) * (x2.to(torch.int64) - zps[1])
    res = requantize(prod, output_multiplier, output_shift) + output_zero_point
    return write_raw(out, _clamp_i8(res))


def quantized_div(
    self: torch.Tensor,
    self_zero_point: int,
    other: torch.Tensor,
    other_zero_point: int,
    output_zero_point: int,
    output_scale: float,
    out: torch.Tensor,
) -> torch.Tensor:
    """``op_quantized_div.cpp``: float32 quotient, ``std::round`` (half away from zero)."""
    info = torch.iinfo(out.dtype)
    n = (raw(_like(self, out)).to(torch.int32) - self_zero_point).numpy().astype(np.float32)
    d = (raw(_like(other, out)).to(torch.int32) - other_zero_point).numpy().astype(np.float32)
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.where(d != 0, n / np.where(d != 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
    scaled = q * np.float32(output_scale)
    rounded = (np.sign(scaled) * np.floor(np.abs(scaled) + np.float32(0.5))).astype(np.float32)
    r = np.clip(rounded + np.float32(output_zero_point), info.min, info.max)
    return write_raw(out, torch.from_numpy(r.astype(np.int64)).to(out.dtype))


def quantized_activation(input: torch.Tensor, lut: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Table lookup: ``lut[x + 128]``."""
    idx = raw(_like(input, out)).to(torch.int64) + 128
    return write_raw(out, raw(lut)[idx])


def _dims4(t: torch.Tensor) -> tuple[int, int, int, int]:
    """The min/max wrappers' dims: the last four logical sizes, leading ones added."""
    sizes = [1, 1, 1, 1, *(int(s) for s in t.shape)][-4:]
    return sizes[0], sizes[1], sizes[2], sizes[3]


def _minmax(
    fn: Callable[..., torch.Tensor], a: torch.Tensor, b: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """``arm_minimum_s8`` / ``arm_maximum_s8``: their pointer walk over the raw buffers, row by row.

    Equal shapes and scalars are one vector operation. Other broadcasts follow CMSIS-NN's loops,
    including its stride for a (N, H, 1, 1) operand against a full one, which steps two values per
    row (a CMSIS-NN defect at this commit; torch broadcasting would differ from the device there).
    """
    x1, x2 = raw(a), raw(b)
    d1, d2, do = _dims4(a), _dims4(b), _dims4(out)
    if d1 == d2:
        return write_raw(out, fn(x1, x2))
    if x1.numel() == 1:
        return write_raw(out, fn(x1.expand_as(x2), x2))
    if x2.numel() == 1:
        return write_raw(out, fn(x1, x2.expand_as(x1)))
    (n1, h1, w1, c1), (n2, h2, w2, c2) = d1, d2
    wd1 = 0 if w1 >= w2 else c1
    wd2 = 0 if w2 >= w1 else c2
    hd1 = wd1 if h1 >= h2 else -w1 * (c1 - wd1)
    hd2 = wd2 if h2 >= h1 else -w2 * (c2 - wd2)
    bd1 = c1 * w1 * h1 if n1 >= n2 else 0
    bd2 = c2 * w2 * h2 if n2 >= n1 else 0
    chunks: list[torch.Tensor] = []

    def take(x: torch.Tensor, p: int, n: int) -> torch.Tensor:
        if p < 0 or p + n > x.numel():
            raise RuntimeError("the broadcast reads outside an input buffer (as CMSIS-NN's loop would)")
        return x[p : p + n]

    def emit(p1: int, n1_: int, p2: int, n2_: int) -> None:
        u, v = take(x1, p1, n1_), take(x2, p2, n2_)
        chunks.append(fn(u.expand_as(v) if n1_ == 1 else u, v.expand_as(u) if n2_ == 1 else v))

    base1 = base2 = 0
    for _ in range(do[0]):
        p1, p2 = base1, base2
        f1, f2 = h1 * w1 * c1, h2 * w2 * c2
        if (h1, w1, c1) == (h2, w2, c2):
            emit(p1, f1, p2, f1)
        elif f1 == 1 or f2 == 1:
            emit(p1, f1, p2, f2)
        else:
            f1, f2 = w1 * c1, w2 * c2
            for _ in range(do[1]):
                if (w1, c1) == (w2, c2):
                    emit(p1, f1, p2, f1)
                    p1, p2 = p1 + f1, p2 + f1
                elif f1 == 1 or f2 == 1:
                    emit(p1, f1, p2, f2)
                    p1, p2 = p1 + f1, p2 + f2
                else:
                    for _ in range(do[2]):
                        if c1 == c2 or c1 == 1 or c2 == 1:
                            emit(p1, c1, p2, c2)
                            p1, p2 = p1 + c1, p2 + c2
                        p1, p2 = p1 - wd1, p2 - wd2
                p1, p2 = p1 + hd1, p2 + hd2
        base1, base2 = base1 + bd1, base2 + bd2
    return write_raw(out, torch.cat(chunks) if chunks else torch.empty(0, dtype=out.dtype))


def minimum(self: torch.Tensor, other: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``arm_minimum_s8`` over the raw buffers with the logical sizes."""
    return _minmax(torch.minimum, self, other, out)


def maximum(self: torch.Tensor, other: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``arm_maximum_s8`` over the raw buffers with the logical sizes."""
    return _minmax(torch.maximum, self, other, out)


def quantized_linear(
    input: torch.Tensor,
    weights: torch.Tensor,
    bias: torch.Tensor | None,
    kernel_sum: torch.Tensor | None,
    input_offset: int,
    filter_offset: int,
    output_offset: int,
    requantize_multipliers: Sequence[int],
    requantize_shifts: Sequence[int],
    activation_max: int,
    activation_min: int,
    out: torch.Tensor,
) -> torch.Tensor:
    """``arm_fully_connected_s8`` (per-tensor: the wrapper passes element 0 of each list).

    DSP/scalar cores add ``bias`` and the offsets; MVE cores read ``kernel_sum`` (bias and the
    input offset folded in ahead of time) and ignore ``bias``: the ahead-of-time pass fills one.
    """
    k = int(input.shape[-1])
    x = raw(input).to(torch.int64).view(-1, k)
    w = raw(weights).to(torch.int64).view(-1, k)
    if kernel_sum is not None:
        acc = _int_matmul(x, w.T) + x.sum(dim=1, keepdim=True) * filter_offset
        acc = acc + raw(kernel_sum).to(torch.int64).view(1, -1)
    else:
        acc = _int_matmul(x + input_offset, (w + filter_offset).T)
        if bias is not None:
            acc = acc + raw(bias).to(torch.int64).view(1, -1)
    res = _finish(
        acc,
        int(requantize_multipliers[0]),
        int(requantize_shifts[0]),
        output_offset,
        activation_min,
        activation_max,
    )
    return write_raw(out, res)


def quantized_batch_matmul(
    lhs: torch.Tensor,
    lhs_zero_point: int,
    rhs_transposed: torch.Tensor,
    rhs_zero_point: int,
    output_zero_point: int,
    output_multiplier: int,
    output_shift: int,
    scratch: torch.Tensor,
    out: torch.Tensor,
) -> torch.Tensor:
    """``arm_batch_matmul_s8``: the ``*_zero_point`` arguments are CMSIS offsets (added)."""
    b, m, k = (int(s) for s in lhs.shape)
    n = int(rhs_transposed.shape[1])
    a = raw(lhs).to(torch.int64).view(b, m, k) + lhs_zero_point
    r = raw(rhs_transposed).to(torch.int64).view(b, n, k) + rhs_zero_point
    acc = _int_matmul(a, r.transpose(1, 2))
    return write_raw(out, _finish(acc, output_multiplier, output_shift, output_zero_point, -128, 127))


def softmax(
    input: torch.Tensor,
    dim: int,
    input_zero_point: int,
    output_zero_point: int,
    input_multiplier: int,
    input_shift: int,
    diff_min: int,
    out: torch.Tensor,
) -> torch.Tensor:
    """``arm_softmax_s8`` over the last dimension (the wrapper refuses any other)."""
    if dim not in (-1, input.dim() - 1):
        raise RuntimeError(f"softmax over dim {dim}: the device kernel takes the last dimension only")
    row = int(input.shape[-1])
    x = raw(input).to(torch.int64).view(-1, row)
    diff = x - x.max(dim=1, keepdim=True).values
    valid = diff >= diff_min
    scaled = _doubling_high_mult(wrap32(diff * (1 << input_shift)), input_multiplier)
    e = _exp_on_negative_values(scaled)
    total = wrap32(torch.where(valid, divide_by_pow2(e, 12), torch.zeros_like(e)).sum(dim=1, keepdim=True))
    headroom = _clz32(total)
    shifted = torch.where(total > 0, wrap32(total << headroom), torch.zeros_like(total))
    scale = _one_over_one_plus_x(wrap32(shifted - _I32_MIN))
    bits_over_unit = 12 - headroom + 23
    res = divide_by_pow2(_doubling_high_mult(scale, e), bits_over_unit) - 128
    res = torch.where(valid, res.clamp(-128, 127), torch.full_like(res, -128))
    return write_raw(out, res.to(torch.int8))


def transpose(input: torch.Tensor, perm: Sequence[int], out: torch.Tensor) -> torch.Tensor:
    """``arm_transpose_s8`` on the raw buffer with the logical sizes (as the wrapper passes them)."""
    x = raw(input).view(input.shape).permute(tuple(int(p) for p in perm))
    return write_raw(out, x.contiguous())


def _is_channels_last(t: torch.Tensor) -> bool:
    """``is_channels_last_tensor`` of the wrappers."""
    if t.dim() != 4:
        return False
    if t.shape[1] == 1 or (t.shape[2] == 1 and t.shape[3] == 1):
        return True
    order = sorted(range(4), key=lambda d: -t.stride(d))
    return order == [0, 2, 3, 1]


def pad(
    input: torch.Tensor,
    pre_pad: Sequence[int],
    post_pad: Sequence[int],
    pad_value: int,
    out: torch.Tensor,
) -> torch.Tensor:
    """``arm_pad_s8``: pads given in the buffer's (N, H, W, C)-like physical order of 4 dims."""
    rank = input.dim()
    nhwc = _is_channels_last(input)
    sizes = [int(input.shape[(0, 2, 3, 1)[4 - rank + i]] if nhwc else input.shape[i]) for i in range(rank)]
    dims = [1] * (4 - rank) + sizes
    x = raw(input).view(dims)
    spec: list[int] = []
    for i in reversed(range(4)):
        spec += [int(pre_pad[i]), int(post_pad[i])]
    return write_raw(out, F.pad(x, spec, mode="constant", value=int(pad_value)))


def _conv_common(
    nhwc: Callable[[torch.Tensor], tuple[torch.Tensor, tuple[int, int, int, int]]],
) -> Callable[..., Any]:
    def quantized_conv2d(
        input: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        stride: Sequence[int],
        padding: Sequence[int],
        dilation: Sequence[int],
        input_offset: int,
        output_offset: int,
        requantize_multipliers: torch.Tensor,
        requantize_shifts: torch.Tensor,
        activation_min: int,
        activation_max: int,
        scratch: torch.Tensor,
        out: torch.Tensor,
    ) -> torch.Tensor:
        """``arm_convolve_wrapper_s8``: weight OHWI, groups = C_in / I."""
        x, (n, h, w, c) = nhwc(input)
        o, kh, kw, i = (int(s) for s in weight.shape)
        wt = raw(weight).view(o, kh, kw, i)
        res = _conv(
            x,
            (n, h, w, c),
            wt,
            bias,
            stride,
            padding,
            dilation,
            c // i,
            input_offset,
            output_offset,
            requantize_multipliers,
            requantize_shifts,
            activation_min,
            activation_max,
        )
        return write_raw(out, res.contiguous())

    return quantized_conv2d


quantized_conv2d = _conv_common(_nhwc)
quantized_conv2d_nhwc = _conv_common(_nhwc_explicit)


def _dw_common(
    nhwc: Callable[[torch.Tensor], tuple[torch.Tensor, tuple[int, int, int, int]]],
) -> Callable[..., Any]:
    def quantized_depthwise_conv2d(
        input: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        stride: Sequence[int],
        padding: Sequence[int],
        dilation: Sequence[int],
        depth_multiplier: int,
        input_offset: int,
        output_offset: int,
        requantize_multipliers: torch.Tensor,
        requantize_shifts: torch.Tensor,
        activation_min: int,
        activation_max: int,
        scratch: torch.Tensor,
        out: torch.Tensor,
    ) -> torch.Tensor:
        """``arm_depthwise_conv_wrapper_s8``: weight [1, H, W, C_in * ch_mult]."""
        x, (n, h, w, c) = nhwc(input)
        _, kh, kw, co = (int(s) for s in weight.shape)
        wt = raw(weight).view(kh, kw, co).permute(2, 0, 1).reshape(co, kh, kw, 1)
        res = _conv(
            x,
            (n, h, w, c),
            wt,
            bias,
            stride,
            padding,
            dilation,
            c,
            input_offset,
            output_offset,
            requantize_multipliers,
            requantize_shifts,
            activation_min,
            activation_max,
        )
        return write_raw(out, res.contiguous())

    return quantized_depthwise_conv2d


quantized_depthwise_conv2d = _dw_common(_nhwc)
quantized_depthwise_conv2d_nhwc = _dw_common(_nhwc_explicit)


def _tconv_common(
    nhwc: Callable[[torch.Tensor], tuple[torch.Tensor, tuple[int, int, int, int]]],
) -> Callable[..., Any]:
    def quantized_transpose_conv2d(
        input: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        stride: Sequence[int],
        padding: Sequence[int],
        output_padding: Sequence[int],
        dilation: Sequence[int],
        input_offset: int,
        output_offset: int,
        requantize_multipliers: torch.Tensor,
        requantize_shifts: torch.Tensor,
        activation_min: int,
        activation_max: int,
        scratch: torch.Tensor,
        output_scratch: torch.Tensor,
        out: torch.Tensor,
    ) -> torch.Tensor:
        """``arm_transpose_conv_wrapper_s8``: int32 sums of the scattered products, bias,
        per-channel requantize (weight OHWI).

        The wrapper passes ``output_padding`` as CMSIS-NN's ``padding_offsets``; where it exceeds
        ``padding`` the output extends past every kernel tap and CMSIS-NN leaves those rows or
        columns unwritten (whatever the buffer held): refused rather than guessed.
        """
        for axis, op, p in (
            ("height", output_padding[0], padding[0]),
            ("width", output_padding[1], padding[1]),
        ):
            if int(op) > int(p):
                raise RuntimeError(
                    f"output_padding {int(op)} > padding {int(p)} in {axis}: CMSIS-NN leaves the last "
                    f"{int(op) - int(p)} output {'rows' if axis == 'height' else 'columns'} unwritten on the device"
                )
        x, (n, h, w, c) = nhwc(input)
        o, kh, kw, i = (int(s) for s in weight.shape)
        groups = c // i
        xin = x.permute(0, 3, 1, 2).to(torch.int64) + input_offset
        wt = raw(weight).view(o, kh, kw, i).permute(3, 0, 1, 2).to(torch.int64)  # IOHW
        acc, _ = _int_conv(
            xin, wt, stride, padding, dilation, groups, transposed=True, output_padding=output_padding
        )
        if bias is not None:
            acc = acc + raw(bias).to(torch.int64).view(1, -1, 1, 1)
        m = raw(requantize_multipliers).to(torch.int64)[:o].view(1, -1, 1, 1)
        s = raw(requantize_shifts).to(torch.int64)[:o].view(1, -1, 1, 1)
        res = _finish(acc, m, s, output_offset, activation_min, activation_max).permute(0, 2, 3, 1)
        return write_raw(out, res.contiguous())

    return quantized_transpose_conv2d


quantized_transpose_conv2d = _tconv_common(_nhwc)
quantized_transpose_conv2d_nhwc = _tconv_common(_nhwc_explicit)


def _pool_out(size: int, kernel: int, stride: int, pad: int, ceil_mode: bool) -> int:
    """``pooling_output_size`` of ``op_quantized_avg_pool2d.cpp``."""
    num = size + 2 * pad - kernel
    out = num // stride + 1 if num >= 0 else -((-num) // stride) + 1
    if ceil_mode and num % stride != 0:
        out += 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def avgpool_s8(
    x: torch.Tensor,
    kernel: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    out_hw: tuple[int, int],
    act_min: int = -128,
    act_max: int = 127,
) -> torch.Tensor:
    """``arm_avgpool_s8`` on NHWC int8: window sum over the valid positions, divided by their
    count rounding half away from zero (``(sum ± count/2) / count`` in C), clamped."""
    n, h, w, c = x.shape
    oh, ow = out_hw
    kh, kw = int(kernel[0]), int(kernel[1])
    sh, sw = int(stride[0]), int(stride[1])
    ph, pw = int(padding[0]), int(padding[1])
    # pad so every window of the output grid lies inside: zeros add nothing, count ignores them
    need_h = max(0, (oh - 1) * sh + kh - ph - h)
    need_w = max(0, (ow - 1) * sw + kw - pw - w)
    xn = x.permute(0, 3, 1, 2).to(torch.float64)
    xp = F.pad(xn, (pw, need_w, ph, need_h))
    ones = F.pad(torch.ones(1, 1, h, w, dtype=torch.float64), (pw, need_w, ph, need_h))
    total = F.avg_pool2d(xp, (kh, kw), (sh, sw), divisor_override=1)[:, :, :oh, :ow]
    count = F.avg_pool2d(ones, (kh, kw), (sh, sw), divisor_override=1)[:, :, :oh, :ow]
    total, count = total.round().to(torch.int64), count.round().to(torch.int64)
    if bool((count == 0).any()):
        raise RuntimeError("an average-pool window covers no input (CMSIS-NN returns ARM_CMSIS_NN_ARG_ERROR)")
    half = count // 2
    res = torch.div(torch.where(total > 0, total + half, total - half), count, rounding_mode="trunc")
    return res.clamp(act_min, act_max).to(torch.int8).permute(0, 2, 3, 1)


def _avg_common(
    nhwc: Callable[[torch.Tensor], tuple[torch.Tensor, tuple[int, int, int, int]]], nchw_out: bool
) -> Callable[..., Any]:
    def quantized_avg_pool2d(
        input: torch.Tensor,
        kernel_size: Sequence[int],
        stride: Sequence[int],
        padding: Sequence[int],
        ceil_mode: bool,
        zero_point: int,
        multiplier: int,
        shift: int,
        scratch: torch.Tensor,
        out: torch.Tensor,
    ) -> torch.Tensor:
        """``op_quantized_avg_pool2d.cpp``: ``arm_avgpool_s8`` on the raw int8 values; the zero
        point, multiplier and shift are unused there (input and output share their quantization)."""
        x, (n, h, w, c) = nhwc(input)
        oh, ow = (
            (int(out.shape[2]), int(out.shape[3])) if nchw_out else (int(out.shape[1]), int(out.shape[2]))
        )
        for size, k, s, p, o, axis in (
            (h, kernel_size[0], stride[0], padding[0], oh, "height"),
            (w, kernel_size[1], stride[1], padding[1], ow, "width"),
        ):
            if _pool_out(size, int(k), int(s), int(p), bool(ceil_mode)) != o:
                raise RuntimeError(f"output {axis} {o} is not the pooled size (the device kernel refuses it)")
        return write_raw(out, avgpool_s8(x, kernel_size, stride, padding, (oh, ow)).contiguous())

    return quantized_avg_pool2d


quantized_avg_pool2d = _avg_common(_nhwc, True)
quantized_avg_pool2d_nhwc = _avg_common(_nhwc_explicit, False)


def maxpool_s8(
    x: torch.Tensor,
    kernel: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    out_hw: tuple[int, int],
    act_min: int,
    act_max: int,
) -> torch.Tensor:
    """``arm_max_pool_s8`` on NHWC int8: max over the valid window positions, clamped."""
    oh, ow = out_hw
    xn = x.permute(0, 3, 1, 2).to(torch.float32)
    kh, kw = int(kernel[0]), int(kernel[1])
    sh, sw = int(stride[0]), int(stride[1])
    ph, pw = int(padding[0]), int(padding[1])
    need_h = max(0, (oh - 1) * sh + kh - ph - x.shape[1])
    need_w = max(0, (ow - 1) * sw + kw - pw - x.shape[2])
    xp = F.pad(xn, (pw, need_w, ph, need_h), value=float("-inf"))
    res = F.max_pool2d(xp, (kh, kw), (sh, sw))[:, :, :oh, :ow]
    return res.clamp(act_min, act_max).to(torch.int8).permute(0, 2, 3, 1)


def _max_common(
    nhwc: Callable[[torch.Tensor], tuple[torch.Tensor, tuple[int, int, int, int]]], nchw_out: bool
) -> Callable[..., Any]:
    def quantized_max_pool2d(
        input: torch.Tensor,
        kernel_size: Sequence[int],
        stride: Sequence[int],
        padding: Sequence[int],
        dilation: Sequence[int],
        ceil_mode: bool,
        input_zero_point: int,
        output_zero_point: int,
        activation_min: int,
        activation_max: int,
        out: torch.Tensor,
    ) -> torch.Tensor:
        """``op_quantized_max_pool2d.cpp``: ``arm_max_pool_s8``; the wrapper refuses ceil mode,
        dilation and differing zero points, so does this."""
        if ceil_mode:
            raise RuntimeError("ceil_mode=True: the device kernel refuses it")
        if any(int(d) != 1 for d in dilation):
            raise RuntimeError(f"dilation {list(dilation)}: the device kernel takes 1 only")
        if input_zero_point != output_zero_point:
            raise RuntimeError("input and output zero points differ: the device kernel refuses it")
        x, _ = nhwc(input)
        oh, ow = (
            (int(out.shape[2]), int(out.shape[3])) if nchw_out else (int(out.shape[1]), int(out.shape[2]))
        )
        res = maxpool_s8(x, kernel_size, stride, padding, (oh, ow), activation_min, activation_max)
        return write_raw(out, res.contiguous())

    return quantized_max_pool2d


quantized_max_pool2d = _max_common(_nhwc, True)
quantized_max_pool2d_nhwc = _max_common(_nhwc_explicit, False)


#: Kernels whose equality with the device is not proven for every argument, and why.
NOT_PROVEN: dict[str, str] = {
    "cortex_m::quantized_transpose_conv2d": (
        "with height padding and height stride > 1, CMSIS-NN's arm_transpose_conv_s8 (this commit) "
        "returns values other than the transposed convolution, which this kernel computes"
    ),
}

#: operator name (without overload) -> out-variant kernel taking the schema's arguments in order.
KERNELS: dict[str, Callable[..., torch.Tensor]] = {
    f"cortex_m::{fn.__name__ if not name else name}": fn
    for name, fn in [
        ("", quantize_per_tensor),
        ("", dequantize_per_tensor),
        ("", quantized_add),
        ("", quantized_mul),
        ("", quantized_div),
        ("", quantized_activation),
        ("", minimum),
        ("", maximum),
        ("", quantized_linear),
        ("", quantized_batch_matmul),
        ("", softmax),
        ("", transpose),
        ("", pad),
        ("quantized_conv2d", quantized_conv2d),
        ("quantized_conv2d_nhwc", quantized_conv2d_nhwc),
        ("quantized_depthwise_conv2d", quantized_depthwise_conv2d),
        ("quantized_depthwise_conv2d_nhwc", quantized_depthwise_conv2d_nhwc),
        ("quantized_transpose_conv2d", quantized_transpose_conv2d),
        ("quantized_transpose_conv2d_nhwc", quantized_transpose_conv2d_nhwc),
        ("quantized_avg_pool2d", quantized_avg_pool2d),
        ("quantized_avg_pool2d_nhwc", quantized_avg_pool2d_nhwc),
        ("quantized_max_pool2d", quantized_max_pool2d),
        ("quantized_max_pool2d_nhwc", quantized_max_pool2d_nhwc),
    ]
}

_WEIGHTS = {
    "weight": "bytes",
    "bias": "bytes",
    "requantize_multipliers": "bytes",
    "requantize_shifts": "bytes",
}
#: How the kernels above read the arguments they do not read whole (``HostArithmetic.reads``):
#: weights, bias and requantization parameters through ``raw`` (memory order and sizes, not
#: strides), the scratch buffers (and the quantizers' ``dtype``, the output's own) not at all.
READS: dict[str, dict[str, str]] = {
    **{
        f"cortex_m::{op}{nhwc}": {**_WEIGHTS, "scratch": "unread"}
        for op in ("quantized_conv2d", "quantized_depthwise_conv2d")
        for nhwc in ("", "_nhwc")
    },
    **{
        f"cortex_m::quantized_transpose_conv2d{nhwc}": {
            **_WEIGHTS,
            "scratch": "unread",
            "output_scratch": "unread",
        }
        for nhwc in ("", "_nhwc")
    },
    "cortex_m::quantized_linear": {"weights": "bytes", "bias": "bytes", "kernel_sum": "bytes"},
    "cortex_m::quantized_batch_matmul": {"scratch": "unread"},
    "cortex_m::quantized_avg_pool2d": {"scratch": "unread"},
    "cortex_m::quantized_avg_pool2d_nhwc": {"scratch": "unread"},
    # the output tensor's own dtype is what they write
    "cortex_m::quantize_per_tensor": {"dtype": "unread"},
    "cortex_m::dequantize_per_tensor": {"dtype": "unread"},
}


# -- references: a quantized program's op in CMSIS-NN's arithmetic ---------------------------


#: Ops ExecuTorch's Cortex-M lowering turns into ``cortex_m::quantized_activation`` (a table).
LUT_ACTIVATIONS = frozenset(
    f"aten.{op}.default"
    for op in ("sigmoid", "tanh", "silu", "gelu", "log", "log2", "log10", "log1p", "sqrt", "rsqrt")
)


def _same_float_on_both_sides(node: Any) -> bool:
    """Whether the host and the reference see the same float: a model input, or a dequantize
    of int8 codes both sides agree on (through ops that only move or copy values)."""
    from etforge.sdk import is_dequantize

    while isinstance(node, torch.fx.Node):
        if node.op == "placeholder" or is_dequantize(node):
            return True
        if node.op != "call_function" or not getattr(node.target, "is_view", False) or not node.args:
            return False
        node = node.args[0]
    return False


def cmsis_reference(value: Callable[[Any], Any], host_op: str) -> Callable[[Any], torch.Tensor]:
    """The value a Cortex-M op must produce for quantize node ``q`` of the quantized program,
    computed from the *Edge op* and its qparams (never from the lowered op's arguments, which
    are what a lowering error gets wrong): ``value(node)`` reads the interpreter's values.

    CMSIS-NN requantizes as TFLite's reference kernels do (``etforge.sdk.Reference``), with two
    differences handled here: ``arm_fully_connected_s8`` rounds twice (``arm_nn_requantize``,
    as the convolutions do) where LiteRT's FULLY_CONNECTED rounds once, and the program's own
    quantize (``cortex_m::quantize_per_tensor``, ``host_op``) is the wrapper's float32 kernel.
    Raises ``etforge.sdk.NotExact`` where neither has a rule.
    """
    from etforge.sdk import NotExact, Out, Q, Reference

    class Cmsis(Reference):
        def compute(self, node: Any, out: Out) -> Any:
            from etforge.sdk import node_op

            if node_op(node) in LUT_ACTIVATIONS:
                return self._lut(node, out)
            if node_op(node) == "aten.linear.default":
                x, w = self.operand(node.args[0]), self.operand(node.args[1])
                bias = self.operand(node.args[2]) if len(node.args) > 2 else None
                acc = self._accumulate(x, w, lambda a, b: a @ b.T)
                # a non-negative channel axis takes device_ref's two-rounding requantization
                return self._finish(acc, x, w, bias, out, axis=acc.ndim - 1)
            return super().compute(node, out)

        def _lut(self, node: Any, out: Out) -> Any:
            """ExecuTorch's Cortex-M lowering bakes the op into a 256-entry int8 table built in
            float from the op and its qparams (``build_activation_lut``): the kernel is a lookup."""
            from executorch.backends.cortex_m.passes.passes_utils import build_activation_lut
            from executorch.exir.dialects._ops import ops as exir_ops

            from etforge.sdk import node_op

            x = self.operand(node.args[0])
            if not isinstance(x, Q) or x.axis is not None:
                raise NotExact("a table activation of a non-quantized or per-channel operand")
            _, name, overload = node_op(node).split(".")
            table = build_activation_lut(
                getattr(getattr(exir_ops.edge.aten, name), overload),
                float(x.scale),
                int(x.zero_point),
                out.scale,
                out.zero_point,
            )
            return table.numpy().astype(np.int64)[x.codes + 128]

    def reference(q: Any) -> torch.Tensor:
        if host_op.startswith("cortex_m.quantize_per_tensor"):
            x = value(q.args[0])
            if not isinstance(x, torch.Tensor) or not x.is_floating_point():
                raise NotExact("quantize of a non-float value")
            if not _same_float_on_both_sides(q.args[0]):
                # a float op's value (a norm's reduction) is not bit-identical between the
                # host's portable kernel and torch: at a rounding tie it may be one step off
                raise NotExact("quantize of a float computed by a float op (kernels round differently)")
            scale, zp, lo, hi = (float(value(a)) if hasattr(a, "op") else a for a in q.args[1:5])
            out = torch.empty(x.shape, dtype=torch.int8)
            return quantize_per_tensor(x.contiguous(), scale, int(zp), int(lo), int(hi), torch.int8, out)
        return Cmsis(value)(q)

    return reference
