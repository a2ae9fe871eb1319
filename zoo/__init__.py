"""The bundled reference models, available as ``zoo:NAME``.

``ZOO``, ``build`` and ``calibration`` load on first use (they import torch); the catalog
(``etforge.zoo.catalog``: names, inputs, descriptions) does not, for ``etforge zoo``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ZOO", "build", "calibration"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from etforge.zoo import models

        return getattr(models, name)
    raise AttributeError(f"module 'etforge.zoo' has no attribute {name!r}")
