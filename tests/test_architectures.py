"""The architecture suite: every family of tests/models/architectures.py, each on one RT700 target.

Each compiles and ``verify`` passes: the host run agrees with the PT2E quantized reference on
top-1 and every NPU op is within a step of its reference op. To keep the suite's wall time
down each family runs on the one target where its pattern matters most (``PLACEMENT``: every
target gets at least four families); the full families × targets sweep is
``bench/architectures.py``, which prints the table docs/targets.md shows.
"""

from __future__ import annotations

import pytest
from models.architectures import FAMILIES, build

import etforge

TARGETS = ("imxrt700", "imxrt700cm", "cortex-m33")
NPU_TARGETS = ("imxrt700", "imxrt700cm")

#: Family -> the target that exercises its target-specific path.
PLACEMENT: dict[str, str] = {
    # imxrt700cm: channels-last inside, CMSIS-NN beside the NPU (GELU as quantized_activation).
    "transformer": "imxrt700cm",
    "mobilenet_v3_se": "imxrt700cm",
    "shufflenet": "imxrt700cm",
    "multi_io": "imxrt700cm",
    # cortex-m33: conv-heavy families on CMSIS-NN only (transpose conv, dilation, depthwise, pad).
    "resnet_projection": "cortex-m33",
    "unet": "cortex-m33",
    "dilated": "cortex-m33",
    "kws_ds": "cortex-m33",
    # imxrt700: NCHW portable kernels around the NPU (boundary transposes, 3-D and 2-D inputs).
    "squeezenet": "imxrt700",
    "efficientnet_lite": "imxrt700",
    "audio_conv1d": "imxrt700",
    "mlp_bn1d": "imxrt700",
}

#: Seeded samples per verify: each compile+verify stays a few seconds.
SAMPLES = 4


def test_every_family_is_placed_and_every_target_gets_four() -> None:
    assert sorted(PLACEMENT) == sorted(FAMILIES)
    for target in TARGETS:
        assert sum(t == target for t in PLACEMENT.values()) >= 4, target


@pytest.mark.parametrize(("family", "target"), sorted(PLACEMENT.items()))
def test_family_compiles_and_verifies(family: str, target: str) -> None:
    model, example, calibration = build(family)
    compiled = etforge.compile(model, example, target=target, calibration=calibration)
    report = compiled.report
    assert report["target"] == target
    if target in NPU_TARGETS:
        assert report["partitions"] and report["macs"]["npu_share"] > 0, report["macs"]
    else:
        assert not report["partitions"]
    verification = compiled.verify(samples=SAMPLES)
    assert verification.ok, verification.failures
