"""The cases the device conformance suite runs (``conformance.py``): ExecuTorch's portable
kernels etforge's programs call, on contiguous and channels-last inputs of odd sizes, with
broadcasting, 0-d and one-element operands.

Inputs shared by every case of a batch (``inputs()``): ``cl`` a 2x3x5x7 channels-last tensor,
``c4`` the same shape contiguous, ``cl1`` a 1x4x3x5 channels-last tensor, ``bc`` a 1x3x1x1
per-channel operand, ``row`` a length-7 vector, ``m`` a 5x7 matrix, ``s`` a 0-d tensor,
``one`` a one-element 1-D tensor.
"""

from __future__ import annotations

import torch

from etforge.runtime.firmware.conformance import Case

F = torch.nn.functional


def inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=g)

    return {
        "cl": r(2, 3, 5, 7).contiguous(memory_format=torch.channels_last),
        "c4": r(2, 3, 5, 7),
        "cl1": r(1, 4, 3, 5).contiguous(memory_format=torch.channels_last),
        "bc": r(1, 3, 1, 1),
        "row": r(7),
        "m": r(5, 7),
        "s": r(),
        "one": r(1),
    }


_g = torch.Generator().manual_seed(1)
_W = torch.randn(4, 3, 3, 3, generator=_g)
_B = torch.randn(4, generator=_g)
_DW = torch.randn(3, 1, 3, 3, generator=_g)
_L = torch.randn(6, 7, generator=_g)
_IDX = torch.tensor([2, 0, 1])
_GIDX = torch.randint(0, 7, (2, 3, 5, 4), generator=_g)


def _c(name: str, fn, *args: str) -> Case:  # noqa: ANN001 - lambdas
    return Case(name, fn, tuple(args))


#: Elementwise kernels (unary, binary with broadcasting, mixed dim orders, 0-d operands).
ELEMENTWISE = [
    _c("relu_cl", torch.relu, "cl"),
    _c("abs_cl", torch.abs, "cl"),
    _c("neg_cl", torch.neg, "cl"),
    _c("sigmoid_cl", torch.sigmoid, "cl"),
    _c("tanh_cl", torch.tanh, "cl"),
    _c("exp_cl", torch.exp, "cl"),
    _c("hardtanh_cl", lambda x: F.hardtanh(x, -0.5, 0.5), "cl"),
    _c("hardswish_cl", F.hardswish, "cl"),
    _c("hardsigmoid_cl", F.hardsigmoid, "cl"),
    _c("leaky_relu_cl", lambda x: F.leaky_relu(x, 0.1), "cl"),
    _c("gelu_cl", F.gelu, "cl"),
    _c("sqrt_cl", lambda x: torch.sqrt(x.abs()), "cl"),
    _c("rsqrt_cl", lambda x: torch.rsqrt(x.abs() + 1), "cl"),
    _c("floor_cl", torch.floor, "cl"),
    _c("round_cl", lambda x: torch.round(x * 4), "cl"),
    _c("clamp_cl", lambda x: torch.clamp(x, -0.3, 0.7), "cl"),
    _c("add_cl_cl", torch.add, "cl", "cl"),
    _c("add_cl_c4", torch.add, "cl", "c4"),
    _c("sub_c4_cl", torch.sub, "c4", "cl"),
    _c("add_cl_bc", torch.add, "cl", "bc"),
    _c("mul_cl_row", torch.mul, "cl", "row"),
    _c("mul_row_cl", torch.mul, "row", "cl"),
    _c("sub_cl_s", torch.sub, "cl", "s"),
    _c("div_cl_bc", torch.div, "cl", "bc"),
    _c("div_bc_cl", lambda b, x: b / (x.abs() + 1), "bc", "cl"),
    _c("maximum_cl_bc", torch.maximum, "cl", "bc"),
    _c("minimum_c4_bc", torch.minimum, "c4", "bc"),
    _c("where_cl_bc", lambda x, b: torch.where(x > 0, x, b), "cl", "bc"),
    _c("gt_cl_bc", torch.gt, "cl", "bc"),
    _c("eq_cl_cl", lambda x: torch.eq(x, x.floor()), "cl"),
    _c("add_s_one", torch.add, "s", "one"),
    _c("mul_s_s", lambda s: s * s + 1.5, "s"),
    _c("exp_s", torch.exp, "s"),
    _c("relu_one", torch.relu, "one"),
    _c("pow_cl", lambda x: torch.pow(x.abs() + 0.5, 1.5), "cl"),
    _c("mul_m_row", torch.mul, "m", "row"),
    _c("add_cl1_cl1t", lambda x: x + x.transpose(2, 3).transpose(2, 3), "cl1"),
]

#: Reductions and normalisations along a dim of a channels-last or contiguous tensor.
REDUCTIONS = [
    _c("mean_hw_cl", lambda x: x.mean((2, 3), keepdim=True), "cl"),
    _c("mean_c_cl", lambda x: x.mean(1), "cl"),
    _c("mean_w_c4", lambda x: x.mean(-1, keepdim=True), "c4"),
    _c("sum_c_cl", lambda x: x.sum(1, keepdim=True), "cl"),
    _c("sum_w_cl", lambda x: x.sum(3), "cl"),
    _c("amax_c_cl", lambda x: x.amax(1), "cl"),
    _c("amin_h_cl", lambda x: x.amin(2, keepdim=True), "cl"),
    _c("argmax_c_cl", lambda x: x.argmax(1), "cl"),
    _c("max_c_cl", lambda x: x.max(1)[0], "cl"),
    _c("softmax_c_cl", lambda x: torch.softmax(x, 1), "cl"),
    _c("softmax_w_cl", lambda x: torch.softmax(x, -1), "cl"),
    _c("log_softmax_c_cl", lambda x: torch.log_softmax(x, 1), "cl"),
    _c("var_c_cl", lambda x: x.var(1, keepdim=True), "cl"),
    _c("layer_norm_w_cl", lambda x: F.layer_norm(x, (7,)), "cl"),
    _c("cumsum_w_cl", lambda x: torch.cumsum(x, 3), "cl"),
    _c("cumsum_c_cl", lambda x: torch.cumsum(x, 1), "cl"),
    _c("mean_one", lambda x: x.mean(), "one"),
    _c("sum_m", lambda x: x.sum(0), "m"),
]

#: Copies and layout kernels: the ones that index as if contiguous are the dim-order hazards.
LAYOUT = [
    _c("flip_w_cl", lambda x: torch.flip(x, [3]), "cl"),
    _c("flip_c_cl", lambda x: torch.flip(x, [1]), "cl"),
    _c("flip_hw_cl1", lambda x: torch.flip(x, [2, 3]), "cl1"),
    _c("roll_h_cl", lambda x: torch.roll(x, 2, 2), "cl"),
    _c("permute_cl", lambda x: x.permute(0, 2, 3, 1) * 1.0, "cl"),
    _c("permute_c4", lambda x: x.permute(3, 1, 0, 2) + 0.0, "c4"),
    _c("transpose_cl", lambda x: x.transpose(1, 3) + 0.0, "cl"),
    _c("reshape_cl", lambda x: x.reshape(2, 105) + 0.0, "cl"),
    _c("flatten_cl1", lambda x: x.flatten(1) * 2.0, "cl1"),
    _c("unsqueeze_cl", lambda x: x.unsqueeze(2) + 0.0, "m"),
    _c("cat_c_cl", lambda x: torch.cat([x, x * 2], 1), "cl"),
    _c("cat_w_cl_c4", lambda x, y: torch.cat([x, y], 3), "cl", "c4"),
    _c("stack_cl", lambda x: torch.stack([x, x + 1], 2), "cl"),
    _c("split_c_cl", lambda x: torch.split(x, [1, 2], 1)[1] + 0.0, "cl"),
    _c("slice_h_cl", lambda x: x[:, :, 1:4] + 0.0, "cl"),
    _c("slice_c_cl", lambda x: x[:, 1:] * 1.5, "cl"),
    _c("select_c_cl", lambda x: x[:, 1] + 0.0, "cl"),
    _c("select_w_cl", lambda x: x[..., 3] * 1.0, "cl"),
    _c("expand_bc", lambda b: b.expand(2, 3, 5, 7) + 0.0, "bc"),
    _c("repeat_cl1", lambda x: x.repeat(1, 2, 1, 2), "cl1"),
    _c("pad_cl", lambda x: F.pad(x, (1, 2, 0, 1), value=0.25), "cl"),
    _c("pixel_shuffle_cl1", lambda x: F.pixel_shuffle(x, 2), "cl1"),
    _c("pixel_unshuffle_cl", lambda x: F.pixel_unshuffle(torch.cat([x, x], 3)[:, :, :4, :4], 2), "cl"),
    _c("index_select_c_cl", lambda x: torch.index_select(x, 1, _IDX), "cl"),
    _c("gather_w_cl", lambda x: torch.gather(x, 3, _GIDX), "cl"),
    _c("tril_m", lambda x: torch.tril(x), "m"),
    _c("topk_w_cl", lambda x: torch.topk(x, 2, 3)[0], "cl"),
    _c("clone_cl", lambda x: x.clone() * 1.0, "cl"),
    _c("contiguous_cl", lambda x: x.contiguous() * 1.0, "cl"),
]

#: Window and matrix kernels.
COMPUTE = [
    _c("conv_cl", lambda x: F.conv2d(x, _W, _B, padding=1), "cl"),
    _c("conv_stride_c4", lambda x: F.conv2d(x, _W, None, stride=2), "c4"),
    _c("conv_dw_cl", lambda x: F.conv2d(x, _DW, None, padding=1, groups=3), "cl"),
    _c("avg_pool_cl", lambda x: F.avg_pool2d(x, 2), "cl"),
    _c("avg_pool_pad_cl", lambda x: F.avg_pool2d(x, 3, 2, 1), "cl"),
    _c("max_pool_cl", lambda x: F.max_pool2d(x, 3, 2, 1), "cl"),
    _c("adaptive_avg_cl", lambda x: F.adaptive_avg_pool2d(x, 1), "cl"),
    _c("upsample_nearest_cl", lambda x: F.interpolate(x, scale_factor=2.0, mode="nearest"), "cl"),
    _c("upsample_bilinear_cl", lambda x: F.interpolate(x, size=(7, 9), mode="bilinear"), "cl"),
    _c("linear_m", lambda x: F.linear(x, _L, _B.repeat(2)[:6]), "m"),
    _c("mm_m", lambda x: x @ x.t(), "m"),
    _c("bmm_cl", lambda x: x[0] @ x[1].transpose(1, 2), "cl"),
    _c("batch_norm_cl", lambda x: F.batch_norm(x, _B[:3], _B[1:].abs(), None, None, False), "cl"),
    _c("group_norm_cl", lambda x: F.group_norm(x, 1), "cl"),
]

ALL = {"elementwise": ELEMENTWISE, "reductions": REDUCTIONS, "layout": LAYOUT, "compute": COMPUTE}


def _q(x: torch.Tensor) -> torch.Tensor:
    return torch.ops.quantized_decomposed.quantize_per_tensor(x, 0.02, 3, -128, 127, torch.int8)


def _dq(q: torch.Tensor) -> torch.Tensor:
    return torch.ops.quantized_decomposed.dequantize_per_tensor(q, 0.02, 3, -128, 127, torch.int8)


_QS = (torch.rand(3, generator=_g) * 0.05 + 0.01).double()  # the kernel takes double scales
_QZ = torch.tensor([0, -3, 5])

#: ExecuTorch's quantized kernels (``quantized_decomposed``, the NPU targets' CPU side) and the
#: portable kernels on the int8 tensors between them.
QUANTIZED = [
    _c("quantize_cl", _q, "cl"),
    _c("quantize_s", _q, "s"),
    _c("dequantize_cl", lambda x: _dq(_q(x)), "cl"),
    _c(
        "quantize_per_channel_cl",
        lambda x: torch.ops.quantized_decomposed.quantize_per_channel(x, _QS, _QZ, 1, -128, 127, torch.int8),
        "cl",
    ),
    _c(
        "dequantize_per_channel_cl",
        lambda x: torch.ops.quantized_decomposed.dequantize_per_channel(
            torch.ops.quantized_decomposed.quantize_per_channel(x, _QS, _QZ, 1, -128, 127, torch.int8),
            _QS,
            _QZ,
            1,
            -128,
            127,
            torch.int8,
        ),
        "cl",
    ),
    _c("int8_flip_cl", lambda x: torch.flip(_q(x), [3]), "cl"),
    _c("int8_cat_cl", lambda x, y: torch.cat([_q(x), _q(y)], 1), "cl", "c4"),
    _c("int8_max_pool_cl", lambda x: F.max_pool2d(_q(x), 2), "cl"),
    _c("int8_permute_cl", lambda x: _q(x).permute(0, 3, 1, 2).contiguous(), "cl"),
    _c("int8_slice_cl", lambda x: _q(x)[:, :, 1:4, ::2], "cl"),
    _c("int8_relu_cl", lambda x: torch.relu(_q(x)), "cl"),
]

ALL["quantized"] = QUANTIZED
