"""The architecture suite: every family of tests/models/architectures.py on every RT700 target.

Each compiles (or is refused by the kernel rule of ``core.kernel_check``, with a message that
names the node, the op and the libraries tried) and ``verify`` passes: the host run agrees
with the PT2E quantized reference on top-1 and every NPU op is within a step of its
reference op. ``bench/architectures.py`` prints the table docs/targets.md shows.
"""

from __future__ import annotations

import pytest
from models.architectures import FAMILIES, build

import etforge
from etforge.core.errors import EtforgeError

TARGETS = ("imxrt700", "imxrt700cm", "cortex-m33")

#: Seeded samples per verify: each compile+verify stays a few seconds.
SAMPLES = 4


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_compiles_and_verifies(family: str, target: str) -> None:
    model, example, calibration = build(family)
    try:
        compiled = etforge.compile(model, example, target=target, calibration=calibration)
    except EtforgeError as exc:
        # The only acceptable refusal: an op without a kernel, named with its node.
        message = str(exc)
        assert "no kernel for" in message and "at node" in message and "libraries tried" in message, message
        return
    report = compiled.report
    assert report["target"] == target
    if target == "cortex-m33":
        assert not report["partitions"]
    verification = compiled.verify(samples=SAMPLES)
    assert verification.ok, verification.failures
