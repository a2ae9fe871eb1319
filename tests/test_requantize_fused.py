"""The convolutions' requantization in one pass (``runtime.arithmetic.requantize_fused``)
equals the kernels' step by step form (``tflite_int.requantize``, itself held to LiteRT in
``tests/test_device_ref.py``) code for code: its float64 and int64 forms, on random layers and
on every accumulator around the rounding boundaries; and the convolution rules that use it
(``device_ref.Reference._lean_conv``) give the step by step rule's codes on real layers."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from etforge.runtime.arithmetic import requantize_fused as rf
from etforge.runtime.arithmetic import tflite_int as ti


def _step_by_step(
    acc: np.ndarray, bias: np.ndarray, real: np.ndarray, zp: int, lo: int, hi: int
) -> np.ndarray:
    shape = [1] * acc.ndim
    shape[1] = -1
    return np.clip(zp + ti.requantize(acc + bias.reshape(shape), real.reshape(shape)), lo, hi).astype(np.int8)


def _both(acc: np.ndarray, bias: np.ndarray, real: np.ndarray, zp: int, lo: int, hi: int) -> dict[str, Any]:
    """Each form's codes (None where it declines) and the step by step form's."""
    terms = rf._terms(bias, real)
    assert terms is not None
    as_float = torch.from_numpy(acc.astype(np.float64))
    return {
        "float64": rf.in_float64(as_float.clone(), terms, zp, lo, hi, 1),
        "int64": rf.in_int64(as_float.clone(), int(np.abs(acc).max()), terms, zp, lo, hi, 1),
        "want": _step_by_step(acc, bias, real, zp, lo, hi),
    }


def _compare(found: dict[str, Any], ran: dict[str, int]) -> None:
    for form in ("float64", "int64"):
        if found[form] is not None:
            ran[form] += 1
            assert np.array_equal(found[form].numpy(), found["want"]), form


def test_random_layers() -> None:
    """Per-channel multipliers from 1e-6 to 10 (left and right shifts), exact powers of two
    (a Q31 multiplier of exactly 2^30), biases, zero points, fused activation ranges."""
    rng = np.random.default_rng(1)
    ran = {"float64": 0, "int64": 0}
    for trial in range(1500):
        channels = int(rng.integers(1, 6))
        kind = trial % 4
        if kind == 0:
            real = rng.random(channels) * 10.0 ** rng.uniform(-6, 1, channels)
        elif kind == 1:
            real = 2.0 ** rng.integers(-20, 4, channels).astype(np.float64)
        elif kind == 2:
            real = np.full(channels, rng.random() * 0.01)
        else:
            real = rng.random(channels) * 3
        top = int(10 ** rng.uniform(0, 7))
        acc = rng.integers(-top, top + 1, size=(2, channels, 5, 7)).astype(np.int64)
        acc[0, :, 0, :3] = [0, -1, 1]
        bias = rng.integers(-5000, 5000, size=(channels,)).astype(np.int64)
        zp = int(rng.integers(-128, 128))
        lo, hi = (-128, 127) if trial % 3 else (int(rng.integers(-128, 0)), int(rng.integers(0, 128)))
        _compare(_both(acc, bias, real, zp, lo, hi), ran)
    assert ran["float64"] > 500 and ran["int64"] > 1000  # both forms ran, not only their fallbacks


@pytest.mark.parametrize("shift", [1, 2, 7, 12, 13, 14, 19])
def test_every_accumulator_around_the_boundaries(shift: int) -> None:
    """Every accumulator in a range covering each code's rounding boundaries (ties of both
    roundings, both signs), on multipliers just above 2^30, at 1.25 and 1.5 of it."""
    real = np.array([2.0**-shift * 1.5, 2.0**-shift * 1.25, 2.0**-shift * 1.0000001])
    span = 300 * 2 ** min(shift, 12)
    acc = np.arange(-span, span + 1, dtype=np.int64).reshape(1, 1, -1).repeat(3, axis=1)
    ran = {"float64": 0, "int64": 0}
    for zp in (-128, 0, 5, 127):
        _compare(_both(acc, np.zeros(3, np.int64), real, zp, -128, 127), ran)
    assert ran["int64"] == 4
    assert ran["float64"] == (4 if shift <= rf._F64_MAX_SHIFT else 0)


def test_without_the_clamp_where_the_bound_allows_the_codes_are_the_step_by_step_ones() -> None:
    """``Requantizer`` given the accumulators' bound leaves out the float64 form's clamp where
    ``_exact_unclamped`` proves every sum exact: on random layers (both outcomes of the proof
    occur) and on accumulators at the bound itself, the codes equal the step by step form's,
    and a bound past the proof's reach keeps the clamp."""
    rng = np.random.default_rng(7)
    taken = {True: 0, False: 0}
    for trial in range(600):
        channels = int(rng.integers(1, 5))
        real = rng.random(channels) * 10.0 ** rng.uniform(-5, -1, channels)
        bound = int(10 ** rng.uniform(1, 7))
        acc = rng.integers(-bound, bound + 1, size=(2, channels, 4, 6)).astype(np.int64)
        acc[0, :, 0, :2] = [bound, -bound]
        bias = rng.integers(-20000, 20000, size=(channels,)).astype(np.int64)
        zp = int(rng.integers(-128, 128))
        lo, hi = (-128, 127) if trial % 3 else (int(rng.integers(-128, 0)), int(rng.integers(0, 128)))
        requantizer = rf.Requantizer(bias, real, zp, lo, hi)
        if requantizer.float64 is None:
            continue
        found = requantizer(torch.from_numpy(acc.astype(np.float64)), bound, 1)
        assert found is not None
        taken[requantizer.unclamped[bound]] += 1
        assert np.array_equal(found.numpy(), _step_by_step(acc, bias, real, zp, lo, hi)), trial
    assert taken[True] > 100 and taken[False] > 10
    # past 2^52 / P the product is not exact: the proof declines
    terms = rf._terms(np.zeros(1, np.int64), np.array([0.7]))
    assert terms is not None and not rf._exact_unclamped(terms, 2**23)


def test_the_lean_convolution_rule_gives_the_step_by_step_codes(monkeypatch: pytest.MonkeyPatch) -> None:
    """A quantized program's convolutions (per-channel, depthwise, strided, with and without
    bias, a fused ReLU6) on random int8 inputs: ``Reference``'s codes with the lean path and
    with it turned off are equal, and the lean path ran."""
    from etforge.core.graph.utils import is_quantize
    from etforge.runtime.arithmetic import device_ref
    from etforge.zoo import models

    model, _ = models.build("mobilenet_v2_96")[:2]
    from etforge.core.build.session import compile_model
    from etforge.core.registry.manager import registry

    calibration = models.calibration("mobilenet_v2_96", 2)
    result = compile_model(
        model.eval(), calibration[0], "imxrt700cm", calibration=calibration, reg=registry()
    )
    module = result.quantized_program.module(check_guards=False)
    env: dict[Any, Any] = {}

    class Record(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            env[n] = out = super().run_node(n)
            return out

    with torch.no_grad():
        Record(module).run(*calibration[1])
    quantizes = [n for n in module.graph.nodes if is_quantize(n) and "per_tensor" in str(n.target)]
    lean_runs = 0
    real_lean = device_ref.Reference._lean_conv

    def counted(self: Any, *args: Any) -> Any:
        nonlocal lean_runs
        value = real_lean(self, *args)
        lean_runs += value is not None
        return value

    def codes() -> list[Any]:
        found = []
        for q in quantizes:
            try:
                found.append(device_ref.Reference(env.__getitem__)(q))
            except device_ref.NotExact as why:
                found.append(str(why))
        return found

    monkeypatch.setattr(device_ref.Reference, "_lean_conv", counted)
    lean = codes()
    assert lean_runs >= 50  # MobileNetV2's convolutions
    monkeypatch.setattr(device_ref.Reference, "_lean_conv", lambda self, *args: None)
    step_by_step = codes()
    for q, a, b in zip(quantizes, lean, step_by_step, strict=True):
        assert type(a) is type(b), q.name
        assert a == b if isinstance(a, str) else torch.equal(a, b), q.name


@pytest.mark.parametrize("op", ["aten.add.Tensor", "aten.sub.Tensor"])
def test_the_add_rule_by_table_gives_the_step_by_step_codes(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """ADD / SUB with each input rescaled through a table of its 256 codes and the output step
    fused (``device_ref._rescaled``, ``Requantizer``) equal the step by step rule on random
    qparams, both inputs' shapes and a broadcast one, a fused ReLU; and the table path ran."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401 - registers quantized_decomposed

    from etforge.runtime.arithmetic import device_ref

    rng = np.random.default_rng(3)
    dq = torch.ops.quantized_decomposed.dequantize_per_tensor.default
    quant = torch.ops.quantized_decomposed.quantize_per_tensor.default
    target = getattr(torch.ops.aten, op.split(".")[1]).Tensor
    tables = 0
    real_rescaled = device_ref._rescaled

    def counted(x: Any, *args: Any) -> Any:
        nonlocal tables
        tables += x.codes.size >= device_ref._BY_TABLE
        return real_rescaled(x, *args)

    for trial in range(60):
        graph = torch.fx.Graph()
        a, b = graph.placeholder("a"), graph.placeholder("b")
        scales = [float(np.float32(10.0 ** rng.uniform(-3, 0))) for _ in range(3)]
        zps = [int(rng.integers(-128, 128)) for _ in range(3)]
        da = graph.call_function(dq, (a, scales[0], zps[0], -128, 127, torch.int8))
        db = graph.call_function(dq, (b, scales[1], zps[1], -128, 127, torch.int8))
        node = graph.call_function(target, (da, db))
        if trial % 3 == 0:
            node = graph.call_function(torch.ops.aten.relu.default, (node,))
        q = graph.call_function(quant, (node, scales[2], zps[2], -128, 127, torch.int8))
        shape_b = (2, 8, 16, 16) if trial % 2 else (1, 8, 1, 1)
        env = {
            a: torch.from_numpy(rng.integers(-128, 128, size=(2, 8, 16, 16)).astype(np.int8)),
            b: torch.from_numpy(rng.integers(-128, 128, size=shape_b).astype(np.int8)),
        }
        monkeypatch.setattr(device_ref, "_rescaled", counted)
        by_table = device_ref.Reference(env.__getitem__)(q)
        monkeypatch.setattr(device_ref, "_BY_TABLE", 1 << 62)
        step_by_step = device_ref.Reference(env.__getitem__)(q)
        monkeypatch.undo()
        assert torch.equal(by_table, step_by_step), trial
    assert tables >= 60
