"""What verify stopped repeating (issue 47) computes what it computed before.

The float check folds conv + BatchNorm as prepare does and delegates only the NPU side (one
partition where the unfolded program was cut at every BatchNorm); the device references sum
integers in float32 where that is provably exact; nodes that read no input are computed once.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch


class _ConvBn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.c1, self.b1 = torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8)
        self.c2, self.b2 = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), torch.nn.BatchNorm2d(8)
        for bn in (self.b1, self.b2):  # statistics of a trained net, not the identity
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.uniform_(-0.2, 0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.b2(self.c2(torch.relu(self.b1(self.c1(x))))))


@pytest.fixture(scope="module")
def conv_bn() -> Any:
    from etforge.core.build.session import compile_model
    from etforge.core.registry.manager import registry

    calib = [(torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(i)),) for i in range(4)]
    return compile_model(_ConvBn().eval(), calib[0], "imxrt700", calibration=calib, reg=registry()), calib


def test_float_check_folds_batch_norms_into_one_npu_partition(conv_bn: Any) -> None:
    """The float program's BatchNorms are folded (the float one computes the same to float
    rounding) and its NPU side is one partition; lowered unfolded, each BatchNorm stays on the
    CPU and cuts it. The float check still compares every NPU op: all within FLOAT_REL_TOL."""
    from etforge.core.build.pipeline import clone_program, lower
    from etforge.core.registry.manager import registry
    from etforge.runtime.verification import float_check, float_program

    result, calib = conv_bn
    reg = registry()
    target = float_check.float_target(reg.target("imxrt700"))
    float_ep = clone_program(result.float_program)
    folded, folds = float_program.folded(float_ep)
    assert folds == 2
    with torch.no_grad():
        a, b = float_ep.module()(*calib[1]), folded.module()(*calib[1])
    assert float((a - b).abs().max()) <= 1e-5 * float(a.abs().max())  # float32 rounding, FLOAT_REL_TOL
    program, _, why = float_program.delegated(clone_program(result.float_program), target, None, reg)
    delegates = [n for n in program.graph.nodes if "call_delegate" in str(n.target)]
    assert len(delegates) == 1 and why["path"] == "early"
    _, _, unfolded, _ = lower(clone_program(result.float_program), target, None, reg, early=False)
    assert len(unfolded) > 1  # what the float check lowered before
    ops = float_check.check_float_program(clone_program(result.float_program), target, None, reg, calib[:2])
    assert len(ops) == 2 and not float_check.failures(ops)  # conv + BatchNorm + ReLU: one NPU op each


def test_integer_sums_in_float32_equal_the_int64_sums() -> None:
    """device_ref sums in float32 only below 2**24 (then exact), in float64 above: both equal
    the int64 convolution, on a layer small enough for float32 and one that is not."""
    from etforge.runtime.arithmetic.device_ref import _F32_EXACT, Q, Reference, _conv_nd, _sum_bound

    g = torch.Generator().manual_seed(1)
    for c_in, expect32 in ((4, True), (512, False)):
        x = torch.randint(-128, 128, (1, c_in, 6, 6), generator=g).numpy().astype(np.int64)
        w = torch.randint(-127, 128, (5, c_in, 3, 3), generator=g).numpy().astype(np.int64)
        assert (_sum_bound(x + 3, w, 0) < _F32_EXACT) == expect32
        q_x = Q(x, np.float32(0.1), np.int64(-3), None)
        q_w = Q(w, np.full(5, 0.01, np.float32), np.zeros(5, np.int64), 0)
        ref = Reference(lambda n: None)
        got = ref._accumulate(q_x, q_w, lambda a, b: _conv_nd(a, b, 1, 1, 1, 1))
        exact = torch.nn.functional.conv2d(torch.from_numpy(x + 3), torch.from_numpy(w), padding=1)
        assert np.array_equal(got, exact.numpy())


def test_exact_value_vmapped_equals_one_sample_at_a_time(conv_bn: Any) -> None:
    """The float64 reference of 8 samples in one vmapped pass is, value for value, the
    reference of each sample alone."""
    from etforge.runtime.verification.constant_nodes import ConstantNodes
    from etforge.runtime.verification.exact_batched import _vmapped, exact_leaves_all
    from etforge.runtime.verification.outputs import exact_leaves

    result, _ = conv_bn
    q_fn = result.quantized_program.module(check_guards=False)
    batches = [
        (torch.randn(1, 3, 16, 16, generator=torch.Generator().manual_seed(10 + i)),) for i in range(9)
    ]
    program = result.host_program
    alone = [exact_leaves(program, q_fn, b) for b in batches]
    assert len(_vmapped(program, q_fn, batches[:8], None)) == 8  # the vmapped path itself runs
    together = exact_leaves_all(program, q_fn, batches, ConstantNodes(q_fn.graph))
    assert len(together) == 9
    for a, b in zip(alone, together, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_srdhm_is_gemmlowps_on_every_sign_and_the_saturating_edge() -> None:
    """``SaturatingRoundingDoublingHighMul`` as gemmlowp writes it (nudge by the product's sign,
    C's division toward zero, INT32_MIN * INT32_MIN saturating), in Python integers, against
    the one-shift form, on the edges and random pairs."""
    from etforge.runtime.arithmetic.tflite_int import srdhm

    lo, hi = -(2**31), 2**31 - 1

    def gemmlowp(a: int, b: int) -> int:
        if a == b == lo:
            return hi
        ab = a * b
        x = ab + (2**30 if ab >= 0 else 1 - 2**30)
        q = abs(x) // 2**31
        return -q if x < 0 else q

    edges = [lo, lo + 1, -(2**30) - 1, -(2**30), -1, 0, 1, 2**30 - 1, 2**30, hi - 1, hi]
    rng = np.random.default_rng(2)
    pairs = [(a, b) for a in edges for b in edges]
    pairs += [(int(a), int(b)) for a, b in rng.integers(lo, hi, (3000, 2), endpoint=True)]
    a = np.array([p[0] for p in pairs], np.int64)
    b = np.array([p[1] for p in pairs], np.int64)
    assert srdhm(a, b).tolist() == [gemmlowp(x, y) for x, y in pairs]


def test_constant_nodes_are_kept_once_and_not_in_a_graph_with_an_in_place_op() -> None:
    from etforge.runtime.verification.constant_nodes import ConstantNodes

    class M(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * (self.w * 2)

    traced = torch.export.export(M(), (torch.randn(4),)).module()
    consts = ConstantNodes(traced.graph)
    kept = [n for n in consts.nodes if n.op == "call_function"]
    assert [str(n.target) for n in kept] == ["aten.mul.Tensor"]  # w * 2, not x * (...)
    graph = torch.fx.Graph()
    p = graph.placeholder("x")
    w = graph.get_attr("w")
    two = graph.call_function(torch.ops.aten.mul.Tensor, (w, 2))
    graph.call_function(torch.ops.aten.add_.Tensor, (two, 1))
    graph.output(graph.call_function(torch.ops.aten.mul.Tensor, (p, two)))
    assert not ConstantNodes(graph).nodes
