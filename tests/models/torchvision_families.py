"""torchvision's classification families as a new user builds them: the library's own
definitions (in-place activations, ``+=`` residuals, ``view``/``transpose`` channel shuffles,
``chunk``, dropout), random seeded weights, a small input, ``num_classes=10``.

BatchNorm statistics are set from seeded data (as ``models.architectures`` does) so
activations keep a healthy range through the depth of these nets after int8 quantization.
``tests/test_realworld.py`` compiles and verifies each on one RT700 target,
``bench/realworld.py`` on every one.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from support import torchvision_models

#: family -> keyword arguments of its torchvision builder (beside ``num_classes``).
FAMILIES: dict[str, dict[str, Any]] = {
    "mobilenet_v2": {},
    "mobilenet_v3_small": {},
    "mobilenet_v3_large": {},
    "shufflenet_v2_x0_5": {},
    "squeezenet1_1": {},
    "resnet18": {},
    "mnasnet0_5": {},
    "efficientnet_b0": {},
    "regnet_x_400mf": {},
    "googlenet": {"aux_logits": False, "init_weights": True},
}

#: Input side: 96 leaves a 3x3 map before every family's global average pool. (At 64 it is
#: 2x2, and a mean of 4 int8 values ties between two steps a quarter of the time, where
#: LiteRT rounds half away from zero and the PT2E reference half to even.)
RESOLUTION = 96
CALIBRATION = 8


def _set_batchnorm_stats(model: nn.Module, resolution: int, seed: int) -> None:
    bns = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None  # a plain average over the batches below
    g = torch.Generator().manual_seed(seed + 1)
    model.train()
    with torch.no_grad():
        for _ in range(2):
            model(torch.randn(8, 3, resolution, resolution, generator=g))
    model.eval()


def build(
    name: str, resolution: int = RESOLUTION, seed: int = 0, calibration: int = CALIBRATION
) -> tuple[nn.Module, tuple[torch.Tensor, ...], list[tuple[torch.Tensor, ...]]]:
    """(torchvision model in eval mode, example input, calibration batches), all seeded."""
    models = torchvision_models()
    torch.manual_seed(seed)
    model = getattr(models, name)(num_classes=10, **FAMILIES[name])
    _set_batchnorm_stats(model, resolution, seed)
    g = torch.Generator().manual_seed(seed + 2)
    batches = [(torch.randn(1, 3, resolution, resolution, generator=g),) for _ in range(calibration)]
    return model, batches[0], batches
