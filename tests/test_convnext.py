"""A ConvNeXt (torchvision's own blocks, a small stage config) compiles on the fast path and
verifies on imxrt700.

Two things it holds that no suite family has:

- its ``LayerNorm2d`` ends in a permute back to NCHW, so the global ``adaptive_avg_pool2d``
  sees a channels-last tensor, whose decomposition restores strides with ``as_strided_``:
  ``core/lower/early.py`` traces it again on contiguous inputs (a [N, C, 1, 1] output is one
  layout either way) instead of leaving the early path;
- a LayerNorm over an input another LayerNorm already centred: its mean is float32 noise
  around 0, which verify's float check measures against the summed terms
  (``runtime/verification/float_check.py``, ``_terms``), not against the ~0 output.

Exact GELU has no NPU form: it stays on the CPU between partitions (reported).
"""

from __future__ import annotations

import torch

import etforge

from support import torchvision_models


def _convnext() -> torch.nn.Module:
    torchvision_models()  # importable beside the CPU torch wheel
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    torch.manual_seed(0)
    return ConvNeXt([CNBlockConfig(16, 32, 1), CNBlockConfig(32, None, 1)], num_classes=10).eval()


def test_convnext_takes_the_early_path_and_verifies() -> None:
    g = torch.Generator().manual_seed(1)
    calibration = [(torch.randn(1, 3, 32, 32, generator=g),) for _ in range(6)]
    compiled = etforge.compile(_convnext(), calibration[0], target="imxrt700", calibration=calibration)
    assert compiled.report["lowering"]["path"] == "early", compiled.report["lowering"]
    off_npu = {n["op"] for n in compiled.report["nodes"] if n["placement"] != "npu"}
    assert off_npu == {"aten.gelu.default"}, off_npu
    verification = compiled.verify(samples=4)
    assert verification.ok, verification.failures
