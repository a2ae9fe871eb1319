"""What each zoo model is, without building it (no torch import): ``etforge zoo`` lists this.

``tests/test_zoo_catalog.py`` checks it against ``etforge.zoo.ZOO`` (names, input shapes,
descriptions), so the two cannot drift apart.
"""

from __future__ import annotations

from typing import NamedTuple


class ZooModel(NamedTuple):
    name: str
    #: The example input's shape (batch of 1); every zoo model takes one float input.
    input_shape: tuple[int, ...]
    description: str
    #: Trained weights and real calibration data (``etforge zoo-data`` writes its test split);
    #: the others have seeded random weights and calibrate on seeded noise.
    trained: bool = False


CATALOG: tuple[ZooModel, ...] = (
    ZooModel("autoencoder", (1, 640), "MLPerf Tiny anomaly detection autoencoder"),
    ZooModel("cifarnet", (1, 3, 32, 32), "NXP CIFAR-10 example net"),
    ZooModel("digits_cnn", (1, 1, 8, 8), "small CNN trained on scikit-learn's 8x8 digits", True),
    ZooModel("digits_mlp", (1, 64), "MLP trained on scikit-learn's 8x8 digits", True),
    ZooModel("ds_cnn", (1, 1, 49, 10), "MLPerf Tiny keyword spotting DS-CNN"),
    ZooModel("mobilenet_v1_025", (1, 3, 96, 96), "MLPerf Tiny VWW MobileNetV1 0.25"),
    ZooModel("mobilenet_v2", (1, 3, 224, 224), "MobileNetV2, 1000 classes"),
    ZooModel("mobilenet_v2_96", (1, 3, 96, 96), "MobileNetV2 at 96x96, 10 classes"),
    ZooModel("resnet8", (1, 3, 32, 32), "MLPerf Tiny image classification ResNet-8"),
)
