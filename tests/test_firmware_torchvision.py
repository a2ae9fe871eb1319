"""torchvision families compiled for cortex-m33 run whole under QEMU (Cortex-M33, ExecuTorch's
C++ runtime, CMSIS-NN, etforge's registration) and compute exactly what etforge's host
interpreter of the same ``.pte`` computes: the library's own definitions (in-place
activations, ``+=`` residuals, channel shuffles through ``view``/``transpose``, fire modules'
``cat``, squeeze-excite) at a small input to bound the emulator's time. ``bench/firmware.py
--torchvision`` runs every family."""

from __future__ import annotations

from pathlib import Path

import pytest

from etforge.runtime.firmware import conformance, device

pytestmark = pytest.mark.skipif(conformance.missing() is not None, reason=str(conformance.missing()))

#: Four families, four architectures: inverted residuals, squeeze-excite + hardswish,
#: channel shuffle, fire modules (cat).
FAMILIES = ["mobilenet_v2", "mobilenet_v3_small", "shufflenet_v2_x0_5", "squeezenet1_1"]
#: Input side: small enough that each runs in seconds under QEMU.
RESOLUTION = 64


@pytest.mark.parametrize("family", FAMILIES)
def test_torchvision_family_bit_exact_on_qemu(family: str, tmp_path: Path) -> None:
    from models.torchvision_families import build as build_family

    import etforge

    model, example, calibration = build_family(family, resolution=RESOLUTION, calibration=4)
    compiled = etforge.compile(model, example, target="cortex-m33", calibration=calibration)
    assert not [n for n in compiled.report["notes"] if "not aligned" in n], compiled.report["notes"]
    out = compiled.save(tmp_path / family)
    compiled.codegen(out / "codegen")
    v = device.verify(out, "qemu-m33", samples=2)
    assert v.failures == [] and v.identical == 2, v.failures
    assert v.planned == v.report_arena and all(n > 0 for n in v.instructions)
