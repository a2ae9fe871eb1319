"""Real-model conformance: torchvision's families compile, take the fast path and verify.

Each family (``tests/models/torchvision_families.py``: torchvision's own definitions with
in-place activations, ``+=`` residuals, channel shuffles, dropout; seeded weights, 96x96,
8 calibration samples) compiles on one RT700 target, the three targets in rotation, and
``verify`` runs its ``.pte`` against the PT2E quantized reference. ``bench/realworld.py``
runs the full families x targets matrix (docs/targets.md, "Real models (torchvision)").
"""

from __future__ import annotations

import pytest
from models.torchvision_families import FAMILIES, build

import etforge

#: Family -> the target it compiles on here (every target gets three or four).
PLACEMENT: dict[str, str] = {
    "resnet18": "imxrt700",  # add_ residuals, relu_ (no out variant on the portable CPU)
    "shufflenet_v2_x0_5": "imxrt700",  # view/transpose/view shuffle, chunk
    "efficientnet_b0": "imxrt700",  # SiLU (LOGISTIC + MUL), SE gates, dropout_
    "mobilenet_v2": "imxrt700",  # ReLU6(inplace=True): hardtanh_
    "squeezenet1_1": "cortex-m33",  # relu_ after every conv, ceil-mode max pools (CMSIS-NN)
    "mnasnet0_5": "imxrt700cm",  # relu_ fused into convs
    "mobilenet_v3_small": "imxrt700cm",  # hardswish_, SE gates with hardsigmoid
    "regnet_x_400mf": "imxrt700cm",  # grouped convolutions
    "mobilenet_v3_large": "cortex-m33",
    "googlenet": "cortex-m33",  # inception branches, ceil-mode pools
}

#: Families with an op the NPU has no form for yet (none since grouped convolutions are split
#: for Neutron): every family is one partition on an NPU target.
SPLIT_ON_NPU: frozenset[str] = frozenset()

#: Input size here: the smallest torchvision keeps every family's shapes valid at, for CI time
#: (bench/realworld.py and docs/targets.md run the 96x96 matrix).
RESOLUTION = 64

#: Seeded samples per verify (as the architecture suite).
SAMPLES = 4


def test_every_family_is_placed_and_every_target_covered() -> None:
    assert sorted(PLACEMENT) == sorted(FAMILIES)
    for target in ("imxrt700", "imxrt700cm", "cortex-m33"):
        assert sum(t == target for t in PLACEMENT.values()) >= 2, target


#: Cases whose top-1 over 4 random-weight samples moves (3/4) while the program equals its
#: device-arithmetic simulation on every output value: verify reports top-1 there as a figure
#: (the network amplifies rounding torch does differently), and the exact simulation is the gate.
TOP1_AMPLIFIED = frozenset(
    {("googlenet", "cortex-m33"), ("regnet_x_400mf", "imxrt700cm"), ("mobilenet_v3_large", "cortex-m33")}
)


def _param(family: str, target: str) -> object:
    return pytest.param(family, target, id=f"{family}-{target}")


@pytest.mark.parametrize(("family", "target"), [_param(f, t) for f, t in sorted(PLACEMENT.items())])
def test_family_compiles_takes_the_fast_path_and_verifies(family: str, target: str) -> None:
    model, example, calibration = build(family, resolution=RESOLUTION)
    compiled = etforge.compile(model, example, target=target, calibration=calibration)
    report = compiled.report
    # In-place ops are functional before quantization, without a re-trace.
    assert not any("in-place" in note for note in report["notes"]), report["notes"]
    if target == "cortex-m33":
        assert not report["partitions"]
    else:
        assert report["lowering"]["path"] == "early", report["lowering"]
        assert report["macs"]["npu_share"] > 0.5, report["macs"]
        if family not in SPLIT_ON_NPU:
            assert len(report["partitions"]) == 1, [p["name"] for p in report["partitions"]]
    verification = compiled.verify(samples=SAMPLES)
    assert verification.ok, verification.failures
    # every value of every output equals the whole program in the device's arithmetic
    assert verification.sim_exact and verification.sim_max_steps == 0.0, verification.sim_unforced
    if (family, target) in TOP1_AMPLIFIED:  # top-1 is reported (a note), not gated, and why
        assert any(n.startswith("top-1 agreement") for n in verification.notes) or (
            verification.top1_vs_exact == SAMPLES
        ), verification.notes
