"""The bundled reference models, available as ``zoo:NAME``."""

from etforge.zoo.models import ZOO, build, calibration

__all__ = ["ZOO", "build", "calibration"]
