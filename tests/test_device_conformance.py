"""Every CPU kernel etforge's programs call, run in the firmware under QEMU (Cortex-M33) and
compared with the host interpreter of the same ``.pte``.

The cases (``runtime/firmware/conformance_cases.py``) put each operator on contiguous and
channels-last inputs of odd sizes, with broadcasting, 0-d and one-element operands; a batch
is one program (one image, one QEMU run) whose outputs are every case's result. The program
goes through etforge's dim-order rewrite (``plugins/targets/dim_orders.align``), so a rule
missing there shows as a device result other than the host's (``flip``: the portable kernel
ignores the dim order) or a kernel failing its checks on the device (``max.dim`` with several
outputs, a C == 1 channels-last copy). Integer and layout results must be the same bytes;
float math-library and accumulation results agree within ``conformance.FLOAT_ULPS``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from etforge.runtime.firmware import build, conformance, device
from etforge.runtime.firmware import conformance_cases as cases

pytestmark = pytest.mark.skipif(conformance.missing() is not None, reason=str(conformance.missing()))


@pytest.mark.parametrize("group", sorted(cases.ALL))
def test_portable_kernels_on_the_device_equal_the_host(group: str, tmp_path: Path) -> None:
    result = conformance.run_batch(cases.ALL[group], cases.inputs(), tmp_path, samples=2)
    assert result.failures == [], [(o.case, o.detail) for o in result.failures]
    assert len(result.outcomes) == 2 * len(cases.ALL[group])
    exact = [o for o in result.outcomes if not o.case.startswith(conformance.LIBM + conformance.ACCUMULATE)]
    assert exact and all(o.detail == "" for o in exact)  # bit for bit, not within a tolerance


def test_every_layout_kernel_saw_a_channels_last_tensor() -> None:
    """The channels-last inputs are what the suite is about: each is channels-last in fact
    (a contiguous tensor would hide every dim-order rule)."""
    x = cases.inputs()
    for name in ("cl", "cl1"):
        assert x[name].is_contiguous(memory_format=torch.channels_last) and not x[name].is_contiguous()
    assert x["s"].dim() == 0 and x["one"].numel() == 1


class _ConvFlipConv(torch.nn.Module):
    """The issue's case: conv -> ``torch.flip`` (a portable kernel between CMSIS-NN convs)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.fc = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.c1(x))
        x = torch.flip(x, [3])
        x = torch.relu(self.c2(x))
        return self.fc(torch.nn.functional.adaptive_avg_pool2d(x, 1).flatten(1))


def test_conv_flip_conv_is_bit_exact_on_cortex_m33(tmp_path: Path) -> None:
    """Was 0/3 on the device (the portable flip flipped the wrong axis of NHWC tensors) while
    the host interpreter passed."""
    import etforge

    torch.manual_seed(0)
    calibration = [(torch.randn(1, 3, 16, 16),) for _ in range(8)]
    compiled = etforge.compile(
        _ConvFlipConv().eval(), calibration[0], target="cortex-m33", calibration=calibration
    )
    assert any("kernel call(s) changed" in n for n in compiled.report["notes"]), compiled.report["notes"]
    out = compiled.save(tmp_path / "flip")
    compiled.codegen(out / "codegen")
    v = device.verify(out, "qemu-m33", samples=3)
    assert v.failures == [] and v.identical == 3, v.failures


class _Kitchen(torch.nn.Module):
    """Every ``cortex_m`` kernel ExecuTorch 1.5 registers, on odd sizes (7x9 input, 5 and 8
    channels), broadcasting operands and NHWC tensors, plus the portable ops between them."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.c = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.d = torch.nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.p = torch.nn.Conv2d(3, 5, 1)
        self.t = torch.nn.ConvTranspose2d(5, 4, 2, stride=2)
        self.fc = torch.nn.Linear(8 * 4 * 5, 6)
        self.scale = torch.nn.Parameter(torch.randn(1, 5, 1, 1))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        F = torch.nn.functional
        a = F.relu(self.c(x))
        b = F.relu6(self.d(a)) + a
        p = self.p(x)
        q = p * self.scale + p
        bf = b.flatten(2)
        y = self.fc(b.flatten(1))
        return (
            torch.maximum(p, q),
            torch.minimum(p, q * 0.5),
            torch.matmul(bf, bf.transpose(1, 2)),
            p / (q.abs() + 1.0),
            y,
            F.hardswish(torch.cat([b, torch.flip(b, [2])], 1)),
            F.avg_pool2d(q, 2),
            torch.sigmoid(self.t(F.max_pool2d(q, 3, 2, 1))),
            torch.softmax(y, -1),
            q.transpose(1, 3) * 0.5,
        )


def test_every_cortex_m_kernel_is_bit_exact_on_the_device(tmp_path: Path) -> None:
    """One cortex-m33 program calling each ``cortex_m`` op of ExecuTorch's operators.yaml."""
    import yaml

    import etforge
    from etforge.runtime.firmware import sources

    torch.manual_seed(0)
    calibration = [(torch.randn(1, 3, 7, 9),) for _ in range(8)]
    compiled = etforge.compile(
        _Kitchen().eval(), calibration[0], target="cortex-m33", calibration=calibration
    )
    out = compiled.save(tmp_path / "kitchen")
    compiled.codegen(out / "codegen")
    used = set(sources.selected_operators(out / "codegen" / "selected_operators.yaml"))
    registered = yaml.safe_load(
        (sources.locate().executorch / "backends/cortex_m/ops/operators.yaml").read_text()
    )
    every = {e["func"].split("(", 1)[0] for e in registered}
    assert every <= used, sorted(every - used)
    v = device.verify(out, "qemu-m33", samples=2)
    assert v.failures == [] and v.identical == 2, v.failures


def test_program_too_large_for_the_emulated_memory_names_the_buffer(tmp_path: Path) -> None:
    """Refused before anything is built, naming the arena that does not fit."""
    import re

    import etforge
    from etforge.core.common.errors import EtforgeError

    model = torch.nn.Sequential(torch.nn.Linear(8, 4)).eval()
    example = (torch.randn(1, 8),)
    compiled = etforge.compile(model, example, target="cortex-m33", calibration=[example])
    out = compiled.save(tmp_path / "big")
    compiled.codegen(out / "codegen")
    header = out / "codegen" / "etforge_model.h"
    header.write_text(re.sub(r"(kArenaBytes\[1\] = \{ )\d+", r"\g<1>20000000", header.read_text()))
    with pytest.raises(EtforgeError, match=r"planned arena memory id 1 \(20000000 bytes\) does not fit"):
        build.build_image(out)


def test_an_emulator_over_its_timeout_is_stopped_and_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``$ETFORGE_QEMU_TIMEOUT`` bounds each QEMU run; past it QEMU is killed and one line says so."""
    from etforge.core.common.errors import EtforgeError
    from etforge.runtime.firmware import qemu

    result = conformance.run_batch(cases.ALL["quantized"][:1], cases.inputs(), tmp_path)  # builds the image
    assert not result.failures
    monkeypatch.setenv(qemu.ENV_TIMEOUT, "0.001")
    with pytest.raises(EtforgeError, match=r"QEMU did not finish .* within 0.001 s and was stopped"):
        conformance.run_batch(cases.ALL["quantized"][:1], cases.inputs(), tmp_path)
