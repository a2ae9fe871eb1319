"""Whole imxrt700 and imxrt700cm programs on the emulated Cortex-M33, the device in the loop:
the CPU side in ExecuTorch's runtime, each host-only NPU partition in TensorFlow Lite Micro
with CMSIS-NN (``--cpu-partitions``: a stand-in on the CPU, never the NPU), every output byte
what the host interpreter computes in the device's arithmetic (LiteRT's reference kernels, with
TFLM's FULLY_CONNECTED and MUL: ``runtime.arithmetic.tflm_arith``).

Economical by design (one sample each; the firmware libraries and TFLM are built once per
content and shared): zoo models, architecture families and a torchvision family, spread over
both targets. Measured: about 32 s of CPU with the images cached, about 95 s when each
program's image is built (their link and registration; the libraries already built). ``bench/firmware.py --target all --tflm`` runs every model on all three targets
(docs/firmware.md). Also: the int8 MUL whose multiplier TFLM computes in double and LiteRT in
float32, and a program whose partitions are Neutron microcode, refused.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from shared_outputs import compile_once

from etforge.core.common.errors import EtforgeError
from etforge.runtime.firmware import conformance, device, tflm

from support import REPO


def _missing() -> str | None:
    why = conformance.missing()
    if why is None:
        try:
            tflm.locate_tflm()
        except EtforgeError as e:
            return str(e)
    return why


pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))

#: (program, target): residuals, SE gates (MUL, hardswish), channel shuffle (CPU-side
#: chunk/cat between partitions), a U-Net (transposed conv, skip cat), a transformer block
#: (RSQRT, which the TFLM build lacked), a
#: torchvision family; cifarnet/ds_cnn/conv-flip-conv are in tests/test_firmware_tflm.py.
PROGRAMS = [
    ("zoo:resnet8", "imxrt700"),
    ("zoo:autoencoder", "imxrt700cm"),
    ("mobilenet_v3_se", "imxrt700cm"),
    ("shufflenet", "imxrt700"),
    ("unet", "imxrt700cm"),
    ("transformer", "imxrt700"),
    ("torchvision:mobilenet_v3_small", "imxrt700cm"),
]
#: Input side of the torchvision program (as tests/test_firmware_torchvision.py).
RESOLUTION = 64


def _build(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], list]:
    from etforge import zoo

    if name.startswith("zoo:"):
        n = name[4:]
        return (*zoo.build(n), zoo.calibration(n, 4))
    if name.startswith("torchvision:"):
        from models.torchvision_families import build as build_tv

        return build_tv(name.split(":", 1)[1], resolution=RESOLUTION, calibration=4)
    from models.architectures import build

    return build(name)


@pytest.mark.parametrize(("name", "target"), PROGRAMS)
def test_npu_target_program_is_bit_exact_on_qemu(name: str, target: str, tmp_path: Path) -> None:
    import etforge

    model, example, calibration = _build(name)
    compiled = etforge.compile(model, example, target=target, calibration=calibration)
    assert compiled.report["partitions"] and all(p["host_only"] for p in compiled.report["partitions"])
    out = compiled.save(tmp_path / "out")
    compiled.codegen(out / "codegen")
    v = device.verify(out, samples=1, cpu_partitions=True)
    assert v.failures == [] and v.identical == 1, v.failures
    assert v.planned == v.report_arena and all(n > 0 for n in v.instructions)
    parts = [r for r in v.per_op if r["op"].startswith("delegate")]
    assert len(parts) == len(compiled.report["partitions"]) == len(v.tflm_arenas)
    assert all(0 < used <= size for size, used in v.tflm_arenas), v.tflm_arenas


# --- int8 MUL: TFLM's multiplier is computed in double, LiteRT's in float32 ---------------

#: Calibration ranges found by search (seed 1, the 4th of 24 pairs) whose MUL scales make the
#: float32 and double multipliers round 14 of the 65,536 int8 pairs to different outputs.
_MUL_SEED, _MUL_PAIRS, _MUL_PAIR = 1, 24, 3


def _mul_calibration() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(_MUL_SEED)
    samples = []
    for _ in range(2):
        xs = []
        for _ in range(2 * _MUL_PAIRS):
            lo = -float(torch.rand(1, generator=g)) * 2 - 0.2
            hi = float(torch.rand(1, generator=g)) * 3 + 0.2
            xs.append(torch.rand(1, 1, 8, 8, generator=g) * (hi - lo) + lo)
        samples.append((xs[2 * _MUL_PAIR], xs[2 * _MUL_PAIR + 1]))
    return samples


class _Mul(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * b


def test_int8_mul_is_computed_as_tflm_does(tmp_path: Path) -> None:
    """TFLM's MUL Prepare (``mul_common.cc``) takes the multiplier s1*s2/s_out in double,
    LiteRT's in float32: their Q31 multipliers differ in the low bits and products near a
    rounding boundary land one step apart. Was 14 of 64 values different on QEMU (the host ran
    LiteRT's MUL); the host now computes TFLM's (``litert_run._run_tflm``)."""
    from ai_edge_litert import schema_py_generated as schema

    import etforge
    from etforge.runtime.arithmetic import tflite_int as ti
    from etforge.runtime.execution import litert_run

    calibration = _mul_calibration()
    compiled = etforge.compile(_Mul().eval(), calibration[0], target="imxrt700cm", calibration=calibration)
    assert [p["operators"] for p in compiled.report["partitions"]] == [{"MUL": 1}]
    out = compiled.save(tmp_path / "mul")
    compiled.codegen(out / "codegen")
    tflite = (out / compiled.report["partitions"][0]["tflite"]).read_bytes()
    graph = schema.ModelT.InitFromPackedBuf(bytearray(tflite), 0).subgraphs[0]
    (s1, z1), (s2, z2), (so, zo) = [
        (float(t.quantization.scale[0]), int(t.quantization.zeroPoint[0])) for t in graph.tensors
    ]
    # every int8 pair, in double and in float32 (independently of the code under test)
    q = np.arange(-128, 128, dtype=np.int64)
    acc = (q[:, None] - z1) * (q[None, :] - z2)
    double = np.clip(ti.requantize(acc, s1 * s2 / so) + zo, -128, 127)
    single = np.clip(ti.requantize(acc, float(np.float32(np.float32(s1) * np.float32(s2)) / np.float32(so))) + zo, -128, 127)  # fmt: skip
    pairs = np.argwhere(double != single)
    assert 0 < len(pairs) <= 64, len(pairs)
    qa, qb = np.zeros(64, np.int64), np.zeros(64, np.int64)
    qa[: len(pairs)], qb[: len(pairs)] = q[pairs[:, 0]], q[pairs[:, 1]]
    a = ((qa - z1) * np.float32(s1)).astype(np.float32).reshape(1, 1, 8, 8)
    b = ((qb - z2) * np.float32(s2)).astype(np.float32).reshape(1, 1, 8, 8)
    # LiteRT's own MUL computes the float32 multiplier's values, the host's TFLM stand-in the double's
    stored = [x.reshape(1, 8, 1, 8) for x in (qa.astype(np.int8), qb.astype(np.int8))]  # NHWC of 1x1x8x8
    (lite,) = litert_run.run(tflite, stored, "reference")
    (tflm_host,) = litert_run.run(tflite, stored, "tflm")
    assert (lite.flatten()[: len(pairs)] == single[pairs[:, 0], pairs[:, 1]]).all()
    assert (tflm_host.flatten()[: len(pairs)] == double[pairs[:, 0], pairs[:, 1]]).all()
    given = tmp_path / "in.npz"
    np.savez(given, a=a, b=b)
    v = device.verify(out, samples=1, cpu_partitions=True, inputs=given)
    assert v.failures == [] and v.identical == 1, v.failures


# --- Neutron microcode is refused: QEMU has no NPU ------------------------------------------


def test_neutron_microcode_is_refused_before_building(tmp_path: Path) -> None:
    """A program compiled with the eIQ Neutron SDK (its test double) carries microcode: even
    with ``--cpu-partitions`` it is refused, one line naming the delegate, before any build."""
    out = tmp_path / "npu"
    model = f"{REPO / 'tests' / 'models' / 'user_models.py'}:small"
    compiled = compile_once(
        model, "--target", "imxrt700", out=out,
        pythonpath=REPO / "tests" / "sdk_double", env={"ETFORGE_SDK_DOUBLE": "v1"},
    )  # fmt: skip
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    with pytest.raises(
        EtforgeError, match=r"delegate 0 \(NeutronBackend, .*\) is Neutron NPU code: QEMU has no NPU"
    ):
        device.verify(out, samples=1, cpu_partitions=True)
    with pytest.raises(EtforgeError, match=r"have no device runtime in the qemu-m33 image"):
        device.run(out, samples=1)


class _ResizeReduce(torch.nn.Module):
    """Nearest and bilinear upsampling, abs, max/min reductions: LiteRT ops etforge emits for
    the NPU targets that etforge's TFLM build had no kernel for."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = torch.relu(self.c1(x))
        up = torch.nn.functional.interpolate(y, scale_factor=2, mode="nearest")
        smooth = torch.nn.functional.interpolate(y, scale_factor=2, mode="bilinear", align_corners=False)
        z = self.c2(up + smooth)
        return z.amax(dim=(2, 3)), torch.abs(z).mean(dim=(2, 3)), (-z).amin(dim=(2, 3))


def test_resize_and_reduce_partitions_run_in_tflm(tmp_path: Path) -> None:
    """Was refused: 'LiteRT op(s) ABS, REDUCE_MAX, ... : no TFLM kernel in etforge's TFLM build'."""
    import etforge

    g = torch.Generator().manual_seed(0)
    calibration = [(torch.randn(1, 3, 12, 12, generator=g),) for _ in range(8)]
    compiled = etforge.compile(
        _ResizeReduce().eval(), calibration[0], target="imxrt700cm", calibration=calibration
    )
    ops = {op for p in compiled.report["partitions"] for op in p["operators"]}
    assert {"ABS", "REDUCE_MAX", "REDUCE_MIN", "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR"} <= ops, ops
    out = compiled.save(tmp_path / "rr")
    compiled.codegen(out / "codegen")
    v = device.verify(out, samples=1, cpu_partitions=True)
    assert v.failures == [] and v.identical == 1, v.failures
