"""The operands of the device-exact rules: an int8/int32 tensor with its qparams (``Q``), an
output's grid (``Out``), and ``NotExact``, raised where a rule does not apply.

Shared by ``device_ref`` and ``device_ref_nonlinear`` (and a CPU library's host arithmetic,
through ``etforge.sdk``), so neither imports the other's internals.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.fx import Node


@dataclass
class Q:
    """An int8/int32 operand: integer codes and their (float32-stored) qparams."""

    codes: np.ndarray
    scale: np.ndarray  # scalar array, or per-channel along ``axis``
    zero_point: np.ndarray
    axis: int | None = None

    def channel(self, rank: int, axis: int) -> tuple[np.ndarray, np.ndarray]:
        """scale, zero point shaped to broadcast along ``axis`` of a rank-``rank`` tensor."""
        if self.axis is None:
            return self.scale, self.zero_point
        shape = [1] * rank
        shape[axis] = -1
        return self.scale.reshape(shape), self.zero_point.reshape(shape)


@dataclass
class Out:
    """An output's grid: the quantize node's qparams and its integer range."""

    scale: float
    zero_point: int
    qmin: int
    qmax: int


class NotExact(Exception):
    """The op (or this use of it) has no device-exact rule yet: the reason says why."""


def arg(node: Node, i: int, name: str, default: Any = None) -> Any:
    """Argument ``i`` of ``node``, or its keyword ``name``, or ``default``."""
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)
