"""Device-exact references match LiteRT's reference-kernel interpreter bit for bit.

Each model below is compiled through etforge (every op on the NPU side), its partition runs in
LiteRT with ``OpResolverType.BUILTIN_REF`` on random inputs, and every int8 value is compared
with ``runtime.arithmetic.device_ref``'s value of the *Edge* op fed the same int8 inputs: 0 values off,
on every op family the rules cover. torch's float evaluation of the same ops (round half to
even, one rounding) is measured beside it and is *not* exact on these cases.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from etforge.runtime.arithmetic import tflite_int as ti

F = torch.nn.functional


class _Convs(torch.nn.Module):
    """conv + relu, depthwise + relu6, strided 1x1 conv, fully connected."""

    def __init__(self) -> None:
        super().__init__()
        self.c = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.d = torch.nn.Conv2d(8, 8, 3, groups=8, padding=1)
        self.e = torch.nn.Conv2d(8, 6, 1, stride=2)
        self.fc = torch.nn.Linear(6 * 5 * 5, 7)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.hardtanh(self.d(torch.relu(self.c(x))), 0.0, 6.0)
        return self.fc(self.e(y).flatten(1))


class _Pools(torch.nn.Module):
    """average pools (VALID, padded), global average (MEAN over H, W), max pool, mean."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = F.avg_pool2d(x, 2), F.avg_pool2d(x, 3, 1, 1)
        c, d = F.adaptive_avg_pool2d(x, 1), F.max_pool2d(x, 3, 2, 1)
        return a.mean((2, 3), keepdim=True) + b.mean((2, 3), keepdim=True) + c + d.mean((2, 3), keepdim=True)


class _Elementwise(torch.nn.Module):
    """mul by a constant, relu, sub, mul, concat, pad, mean and sum over the last dim, add."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 0.5
        z = torch.relu(x) - y
        u = torch.cat([z * x, z], 1)
        return F.pad(u, (1, 1, 0, 0)).mean(-1) + u.sum(-1) * 0.1


class _Attention(torch.nn.Module):
    """layer-norm-like statistics (two means) and 3-D fully connected layers."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = x - x.mean(-1, keepdim=True)
        var = (v * v).mean(-1, keepdim=True)
        return self.q(v) + self.k(x) * var


class _Nonlinear(torch.nn.Module):
    """softmax over the last dim and over channels, sigmoid, tanh, leaky relu, exp, log, abs, rsqrt."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.softmax(x, -1) + torch.softmax(2.0 * x, 1)
        b = torch.sigmoid(x) + torch.tanh(x) + F.leaky_relu(x, 0.1)
        c = torch.exp(0.3 * x) + torch.log(x * x + 0.5) + torch.abs(x) + torch.rsqrt(x * x + 1)
        return a + b + c


class _Matrix(torch.nn.Module):
    """bmm of two runtime operands, mm and addmm with constant matrices, prelu, amax / amin, neg."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(16, 16), requires_grad=False)
        self.b = torch.nn.Parameter(torch.randn(16), requires_grad=False)
        self.p = torch.nn.PReLU(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.bmm(x, x.transpose(1, 2)).sum(-1, keepdim=True)
        z = (torch.mm(x[0], self.w) + torch.addmm(self.b, x[0], self.w)).unsqueeze(0)
        m = torch.amax(x, -1, keepdim=True) + torch.amin(x, -1, keepdim=True)
        return y + z + m + torch.neg(x) + self.p(x.unsqueeze(-1)).squeeze(-1)


class _Resample(torch.nn.Module):
    """bilinear (half-pixel and align_corners) and nearest resize, reflect pad, transposed conv,
    concatenation, split, permute / reshape, dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.c = torch.nn.Conv2d(4, 4, 1)
        self.t = torch.nn.ConvTranspose2d(4, 4, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = F.interpolate(x, scale_factor=2, mode="bilinear")
        b = F.interpolate(x, size=(11, 11), mode="bilinear", align_corners=True)
        d = F.interpolate(x, scale_factor=2, mode="nearest")
        y = torch.cat([x, self.c(x) * 3], 1)
        s1, s2 = torch.split(y, [3, 5], 1)
        z = y.permute(0, 2, 3, 1).reshape(1, -1, 8).mean(1)
        head = a + F.pad(b, (0, 1, 0, 1)) + d + self.t(x)
        return (
            head.mean((2, 3)) + s1.mean((1, 2, 3)).unsqueeze(1) + s2.mean((1, 2, 3)).unsqueeze(1) + z[:, :4]
        )


class _Reflect(torch.nn.Module):
    """reflect padding (MIRROR_PAD)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.abs(x) + F.pad(x, (1, 1, 2, 2), mode="reflect")[..., 2:-2, :-2]


class _Recurrent(torch.nn.Module):
    """an LSTM: its per-step slices of one projection land on other qparams (a requantize
    after a relabel), its gates are sigmoid, tanh, mul and add."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = torch.nn.LSTM(8, 12, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rnn(x)[0][:, -1]


class _Heads(torch.nn.Module):
    """4-D matmuls of two runtime operands (attention heads): Edge decomposes them after
    quantization into expand, view, bmm, view, so the quantize node follows a view of the
    bmm's float output (moved codes)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = x.view(1, 8, 2, 8).transpose(1, 2)
        s = torch.softmax(torch.matmul(q, q.transpose(-1, -2)), -1)
        return torch.matmul(s, q).transpose(1, 2).reshape(1, 8, 16)


CASES = {
    "heads": (_Heads, (1, 8, 16)),
    "recurrent": (_Recurrent, (1, 5, 8)),
    "reflect": (_Reflect, (1, 4, 6, 6)),
    "convs": (_Convs, (1, 3, 10, 10)),
    "pools": (_Pools, (1, 8, 9, 9)),
    "elementwise": (_Elementwise, (1, 4, 6, 6)),
    "attention": (_Attention, (1, 8, 16)),
    "nonlinear": (_Nonlinear, (1, 8, 16)),
    "nonlinear_4d": (_Nonlinear, (2, 3, 5, 7)),
    "matrix": (_Matrix, (1, 8, 16)),
    "resample": (_Resample, (1, 4, 6, 6)),
}
_NONLINEAR = {"_softmax", "sigmoid", "tanh", "leaky_relu", "exp", "log", "abs", "rsqrt"}
#: Ops each case must have compared exactly (the rule families it proves).
COVERS = {
    "convs": {"convolution", "linear"},
    "pools": {"avg_pool2d", "mean", "getitem", "add"},  # getitem: max_pool2d_with_indices
    "elementwise": {"mul", "relu", "sub", "cat", "constant_pad_nd", "mean", "sum", "add"},
    "attention": {"mean", "sub", "mul", "linear", "add"},
    "nonlinear": _NONLINEAR,
    "nonlinear_4d": _NONLINEAR,
    "matrix": {"bmm", "mm", "addmm", "prelu", "amax", "amin", "neg"},
    "heads": {"view", "_softmax"},
    "resample": {"upsample_bilinear2d", "upsample_nearest2d", "convolution", "cat", "slice", "view"},
    "reflect": {"pad", "abs", "add"},
    "recurrent": {"squeeze", "linear", "sigmoid", "tanh", "mul", "add"},
}
#: Where a target converts differently (imxrt700cm: a global mean is an AVERAGE_POOL_2D).
COVERS_ON = {("pools", "imxrt700cm"): {"avg_pool2d", "getitem", "add"}}
#: The NPU targets whose conversions the cases run through.
TARGETS = ("imxrt700", "imxrt700cm")


def _parity(name: str, samples: int = 4, target: str = "imxrt700", seed: int = 0) -> list[Any]:
    from etforge.core.build.session import compile_model
    from etforge.runtime.execution.host import run_program
    from etforge.runtime.verification.stepwise import op_parity

    cls, shape = CASES[name]
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    calib = [(torch.randn(*shape, generator=g),) for _ in range(4)]
    result = compile_model(cls().eval(), calib[0], target, calibration=calib)
    found = []
    for _ in range(samples):
        calls: list[Any] = []
        run_program(result.host_program, (1.5 * torch.randn(*shape, generator=g),), "reference", calls)
        for lowered, args in calls:
            found.extend(op_parity(lowered, args))
    return found


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_every_op_equals_its_device_exact_reference(name: str, target: str) -> None:
    found = [p for p in _parity(name, target=target) if not p.skipped]
    exact = [p for p in found if p.device_exact]
    assert all(p.elements_off == 0 for p in exact), [(p.node, p.first_off) for p in exact if p.elements_off]
    covered = {p.node.rstrip("_0123456789") for p in exact}
    assert COVERS_ON.get((name, target), COVERS[name]) <= covered, covered
    not_exact = [(p.node, p.reason) for p in found if not p.device_exact]
    assert not_exact == [], not_exact


def test_torch_rounding_is_not_the_devices() -> None:
    """The same ops in torch's float arithmetic are off on some values (the old gate's
    false failures on MEAN / AVERAGE_POOL): the exact reference is what makes 0 possible."""
    found = _parity("pools") + _parity("attention")
    assert sum(p.torch_values_off for p in found) > 0
    assert all(p.elements_off == 0 for p in found if p.device_exact)


def test_fixed_point_primitives_follow_tflite() -> None:
    """QuantizeMultiplier / MultiplyByQuantizedMultiplier on hand-checked values."""
    assert ti.quantize_multiplier(1.0) == (1 << 30, 1)
    assert ti.quantize_multiplier(0.04) == (1374389535, -4)
    # x * 0.5 is SaturatingRoundingDoublingHighMul alone: its nudge (1 - 2^30 below zero,
    # then C division) rounds -1.5 to -1 and -2.5 to -2, +1.5 to 2 (by hand from common.h)
    m, s = ti.quantize_multiplier(0.5)
    got = ti.multiply_by_quantized_multiplier(np.array([3, -3, 5, -5]), m, s)
    assert got.tolist() == [2, -1, 3, -2]
    # x * 0.25: RoundingDivideByPOT(., 1) after it rounds halves away from zero
    m, s = ti.quantize_multiplier(0.25)
    assert ti.multiply_by_quantized_multiplier(np.array([2, -2, 6, -6]), m, s).tolist() == [1, -1, 2, -2]
    assert ti.divide_round_away(np.array([7, -7, 8, -8]), 2).tolist() == [4, -4, 4, -4]
    assert ti.round_away(np.array([0.5, -0.5, 1.5, -2.5])).tolist() == [1.0, -1.0, 2.0, -3.0]


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("name", ["nonlinear", "matrix"])
def test_other_weights_and_inputs_stay_exact(name: str, seed: int) -> None:
    """Other seeds: other qparams, so other multipliers, shifts and tables."""
    found = [p for p in _parity(name, samples=2, seed=seed) if not p.skipped and p.device_exact]
    assert found and all(p.elements_off == 0 for p in found), [
        (p.node, p.first_off) for p in found if p.elements_off
    ]


class _HardSwish(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.hardswish(2.0 * x) + F.hardswish(x + 1.0)


@pytest.mark.parametrize("target", TARGETS)
def test_hard_swish_kernel_is_exact(target: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """etforge decomposes hardswish before quantization (plugins/rewrites/activation.py); with
    that rewrite off the HARD_SWISH converter runs, and its int8 kernel is reproduced exactly."""
    from etforge.plugins.rewrites.activation import Hardsigmoid

    monkeypatch.setattr(Hardsigmoid, "apply", lambda self, gm, target: False)
    CASES["hard_swish"] = (_HardSwish, (1, 4, 6, 6))
    try:
        found = [p for p in _parity("hard_swish", samples=3, target=target) if not p.skipped]
    finally:
        del CASES["hard_swish"]
    hs = [p for p in found if p.node.startswith("hardswish")]
    assert len({p.node for p in hs}) == 2 and all(p.device_exact for p in hs), found
    assert all(p.elements_off == 0 for p in found if p.device_exact), [(p.node, p.first_off) for p in found]


class _Neg(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return -x


@pytest.mark.parametrize("target", ("litert", *TARGETS))
def test_neg_with_a_nonzero_zero_point(target: str) -> None:
    """int8 NEG in LiteRT negates codes, ignoring the zero point: etforge lowers neg as MUL by
    -1, so an input far from symmetric (zero point near -128) still comes out right."""
    from etforge.testing import check_op

    x = torch.rand(1, 4, 8, 8) * 4.0 + 1.0  # all positive: zero point -128, output's +127
    calibration = [(torch.rand(1, 4, 8, 8) * 4.0 + 1.0,) for _ in range(4)]
    check_op(_Neg().eval(), (x,), target, calibration=calibration)


#: gemmlowp's exp / reciprocal / inverse sqrt are accurate to a few raw units of Q0.31
#: (its own tests bound them so); 2^-20 of full scale is far below one int8 step.
FIXED_POINT_TOL = 2**-20


def test_fixed_point_functions_approximate_the_math() -> None:
    """exp on [-31, 0] (Q5.26 in), 1/(1+x) on [0, 1), 1/sqrt(n): each within FIXED_POINT_TOL."""
    from etforge.runtime.arithmetic import fixedpoint as fp

    x = np.linspace(-31.0, 0.0, 2001)
    got = fp.exp_on_negative_values(np.round(x * 2**26).astype(np.int64), 5) / 2**31
    assert np.abs(got - np.exp(np.round(x * 2**26) / 2**26)).max() < FIXED_POINT_TOL
    y = np.linspace(0.0, 0.999, 1001)
    got = fp.one_over_one_plus_x(np.round(y * 2**31).astype(np.int64)) / 2**31
    assert np.abs(got - 1 / (1 + np.round(y * 2**31) / 2**31)).max() < FIXED_POINT_TOL
    for n in (2, 3, 17, 1000, 65535, 1 << 20, (1 << 30) + 7):
        m, shift = fp.inv_sqrt_multiplier(n, -1)
        value = m / 2**31 * 2.0**shift
        assert abs(value * np.sqrt(n) - 1) < FIXED_POINT_TOL * 16, n


def _edge_value(
    op: Any, operands: list[tuple[float, int, torch.dtype]], out: tuple[float, int], codes: list[np.ndarray]
) -> np.ndarray:
    """``Reference``'s value of ``q(op(dq(x0), dq(x1), ...))`` built as an Edge-style graph."""
    import torchao.quantization.pt2e  # noqa: F401 (registers quantized_decomposed)

    from etforge.runtime.arithmetic.device_ref import Reference

    qd = torch.ops.quantized_decomposed
    g = torch.fx.Graph()
    env: dict[Any, torch.Tensor] = {}
    dqs = []
    for i, ((scale, zp, dtype), c) in enumerate(zip(operands, codes, strict=True)):
        p = g.placeholder(f"x{i}")
        env[p] = torch.from_numpy(c)
        info = torch.iinfo(dtype)
        dqs.append(
            g.call_function(qd.dequantize_per_tensor.default, (p, scale, zp, info.min, info.max, dtype))
        )
    q = g.call_function(
        qd.quantize_per_tensor.default, (g.call_function(op, tuple(dqs)), *out, -128, 127, torch.int8)
    )
    return Reference(env.__getitem__)(q).numpy()


def _litert_value(
    builtin: str, opts: str, tensors: list[tuple[list[int], str, Any, Any]], inputs: list[np.ndarray]
) -> np.ndarray:
    """One LiteRT operator (tensors: shape, dtype, qparams, constant data or None; the last is
    the output) run by the reference kernels on ``inputs`` (the non-constant tensors)."""
    from etforge.core.litert.builder import LiteRTBuilder, Quant, options
    from etforge.runtime.execution.litert_run import run

    b = LiteRTBuilder()
    ids = [
        b.add_tensor(shape, dtype, f"t{i}", data=data, quant=Quant.per_tensor(*qp))
        for i, (shape, dtype, qp, data) in enumerate(tensors)
    ]
    b.add_operator(builtin, ids[:-1], ids[-1:], options(opts))
    b.inputs = [i for i, t in zip(ids[:-1], tensors, strict=False) if t[3] is None]
    b.outputs = ids[-1:]
    return run(b.finish(), inputs, "reference")[0]


def test_mul_multiplier_is_computed_in_float32() -> None:
    """MUL's Prepare multiplies and divides the scales in float32: in double, 7 of the 65,536
    code pairs of mobilevit_xxs's layer-norm MUL (qparams below) come out one step off."""
    s1, s2, out = (0.053363192826509476, 10), (0.009516499005258083, -128), (0.029421431943774223, -12)
    a = np.repeat(np.arange(-128, 128, dtype=np.int8), 256)
    b = np.tile(np.arange(-128, 128, dtype=np.int8), 256)
    litert = _litert_value(
        "MUL",
        "MulOptions",
        [([65536], "int8", s1, None), ([65536], "int8", s2, None), ([65536], "int8", out, None)],
        [a, b],
    )
    ours = _edge_value(torch.ops.aten.mul.Tensor, [(*s1, torch.int8), (*s2, torch.int8)], out, [a, b])
    assert int((litert != ours).sum()) == 0


def test_batch_matmul_multiplies_the_scales_in_float32() -> None:
    """BATCH_MATMUL's Prepare takes the product of its operands' scales in float32: with the
    product in double, 8 of these 278,528 values (deit_tiny's attention-times-values qparams)
    are one step off LiteRT's kernel."""
    sa, sb, out = (0.0006183295045047998, 0), (0.008579924702644348, 0), (0.0018246556865051389, 9)
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (256, 17, 17), dtype=np.int8)
    b = rng.integers(-128, 128, (256, 17, 64), dtype=np.int8)
    litert = _litert_value(
        "BATCH_MATMUL",
        "BatchMatMulOptions",
        [
            ([256, 17, 17], "int8", sa, None),
            ([256, 17, 64], "int8", sb, None),
            ([256, 17, 64], "int8", out, None),
        ],
        [a, b],
    )
    ours = _edge_value(torch.ops.aten.bmm.default, [(*sa, torch.int8), (*sb, torch.int8)], out, [a, b])
    assert int((litert != ours).sum()) == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fully_connected_requantizes_at_double_precision(seed: int) -> None:
    """FULLY_CONNECTED's output step is acc * (double) multiplier, halves away: a Q31
    multiplier with one rounding is one step off on rare accumulators (here swin_t's qparams:
    1 of 262,144 values at seed 0)."""
    sx, sw, out = (0.031401198357343674, -6), 0.00050456275, (0.018074171617627144, 1)
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (4096, 768), dtype=np.int8)
    w = rng.integers(-127, 128, (64, 768), dtype=np.int8)
    bias = rng.integers(-20000, 20000, (64,), dtype=np.int32)
    bscale = float(np.float32(sx[0])) * float(np.float32(sw))
    litert = _litert_value(
        "FULLY_CONNECTED",
        "FullyConnectedOptions",
        [
            ([4096, 768], "int8", sx, None),
            ([64, 768], "int8", (sw, 0), w),
            ([64], "int32", (bscale, 0), bias),
            ([4096, 64], "int8", out, None),
        ],
        [x],
    )
    operands = [(*sx, torch.int8), (sw, 0, torch.int8), (bscale, 0, torch.int32)]
    ours = _edge_value(torch.ops.aten.linear.default, operands, out, [x, w, bias])
    assert int((litert != ours).sum()) == 0


def test_vectorized_multipliers_equal_quantize_multiplier_per_element() -> None:
    """``multipliers`` (verify's per-channel path, vectorized) is ``QuantizeMultiplier`` on each
    element, the edges included: zero, a shift below -31 (0, 0), above 30 (saturated), a
    mantissa rounding up to 2^31 (halved, shift + 1), negative reals."""
    import numpy as np

    from etforge.runtime.arithmetic import tflite_int as ti

    g = np.random.default_rng(0)
    reals = np.concatenate(
        [
            g.uniform(1e-6, 1.0, 500),
            np.exp(g.uniform(-30, 5, 500)),
            [
                0.0,
                2.0**-40,
                2.0**-32,
                2.0**-31,
                2.0**31,
                2.0**40,
                1 - 2.0**-34,
                0.5 - 2.0**-35,
                -0.3,
                -(2.0**-35),
            ],
        ]
    ).reshape(2, -1)
    m, s = ti.multipliers(reals)
    want = [ti.quantize_multiplier(float(r)) for r in reals.reshape(-1)]
    assert m.shape == s.shape == reals.shape and m.dtype == s.dtype == np.int64
    assert list(zip(m.reshape(-1).tolist(), s.reshape(-1).tolist(), strict=True)) == want


def test_rounding_divide_by_pot_is_gemmlowps_on_every_sign_and_shift() -> None:
    """``RoundingDivideByPOT`` as gemmlowp writes it in C — ``(x >> e) + (remainder >
    threshold)``, threshold one higher below zero — element by element in Python integers, on
    int32 values of both signs, ties included, shifts 0 to 31 (scalar, per element and per channel)."""
    import numpy as np

    from etforge.runtime.arithmetic import tflite_int as ti

    def c(x: int, e: int) -> int:
        mask = (1 << e) - 1
        return (x >> e) + int((x & mask) > (mask >> 1) + int(x < 0))

    g = np.random.default_rng(0)
    ties = [s * ((2 * k + 1) << e) >> 1 for e in range(1, 12) for k in range(3) for s in (1, -1)]
    x = np.concatenate([g.integers(-(2**31), 2**31, 2000), np.arange(-300, 300), ties, [-(2**31), 2**31 - 1]])
    for e in range(32):
        got = ti.rounding_divide_by_pot(x, e)
        assert got.tolist() == [c(int(v), e) for v in x], e
    shifts = g.integers(0, 32, x.size)  # per element, zero among them
    got = ti.rounding_divide_by_pot(x, shifts)
    assert got.tolist() == [c(int(v), int(e)) for v, e in zip(x, shifts, strict=True)]
    for e in (np.maximum(shifts, 1), shifts % 21, shifts % 21 + 3):  # no zero shift; spans <= 30
        got = ti.rounding_divide_by_pot(x, e)
        assert got.tolist() == [c(int(v), int(k)) for v, k in zip(x, e, strict=True)]
    channels = g.integers(0, 16, (1, 7, 1))  # per channel, broadcast
    cube = g.integers(-(2**31), 2**31, (3, 7, 5))
    got = ti.rounding_divide_by_pot(cube, channels)
    want = [
        [[c(int(cube[i, j, k]), int(channels[0, j, 0])) for k in range(5)] for j in range(7)]
        for i in range(3)
    ]
    assert got.tolist() == want
