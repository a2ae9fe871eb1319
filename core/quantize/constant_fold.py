"""``convert_pt2e``'s constant folding without the dequantizations it computes and discards.

torchao's ``ConstantFolder`` runs every node whose inputs are constants, then asks whether the
node may be folded: a ``dequantize`` may not (it stays in the graph for the backend to fuse),
so its value is dropped. On a weight that value is the whole float weight recomputed from its
int8 codes: on resnet18 every convolution's weights once more (~0.1 s of CPU), for nothing.

Inside :func:`skip_discarded_dequantize`, the folder gives such a node "unknown" without
computing it, which is what it answers after computing it. Only where that answer is certain:
a ``quantized_decomposed`` dequantize (in the folder's never-folded list) of a real (not
``meta``) tensor of the dtype the node names, as PT2E writes them; anything else is computed
as before (so a call that would fail still fails). The folded constants, the graph and every
program are unchanged (``tests/test_quantize_convert.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.fx import Node
from torchao.quantization.pt2e.constant_fold import ConstantFolder

from etforge.core.common.scoped_patch import ScopedPatch

_qd = torch.ops.quantized_decomposed
#: Dequantize ops the folder never folds, each with the position of its ``dtype`` argument.
_DTYPE_ARG = {
    _qd.dequantize_per_channel.default: 6,
    _qd.dequantize_per_tensor.default: 5,
    _qd.dequantize_per_tensor.tensor: 5,
}

_COMPUTE = ConstantFolder._deduce_value


def _deduce_value(self: ConstantFolder, node: Node) -> Any:
    if self.lifted_constant_names is None and _discarded(self, node):
        return self.unknown_value
    return _COMPUTE(self, node)


def _discarded(folder: ConstantFolder, node: Node) -> bool:
    """Would the folder compute ``node``'s value only to answer "unknown" (never fold it)?"""
    index = _DTYPE_ARG.get(node.target) if node.op == "call_function" else None  # type: ignore[arg-type]
    if index is None or len(node.args) <= index or not isinstance(node.args[0], Node):
        return False
    value = folder.env.get(node.args[0])
    if not isinstance(value, torch.Tensor) or value.device.type == "meta":
        return False  # a meta value would be kept (the folder returns meta results as they are)
    if value.dtype != node.args[index]:
        return False  # the op refuses this input: computed, so it fails as it did
    if index == 6:  # per channel: an axis the input has
        axis = node.args[3]
        return isinstance(axis, int) and 0 <= axis < value.dim()
    return True


_PATCH = ScopedPatch(
    lambda: setattr(ConstantFolder, "_deduce_value", _deduce_value),
    lambda: setattr(ConstantFolder, "_deduce_value", _COMPUTE),
)

#: Off: the folder computes every node (the tests compare both ways).
ENABLED = True


@contextmanager
def skip_discarded_dequantize() -> Iterator[None]:
    """ConstantFolder skips the dequantizations it would discard, for the length of the block."""
    if not ENABLED:
        yield
        return
    with _PATCH.scope():
        yield
