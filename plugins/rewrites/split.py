"""split / split_with_sizes / chunk / unbind as slices.

LiteRT's SPLIT family needs equal parts or a size tensor, and ExecuTorch decomposes every
spelling into ``split_with_sizes_copy``, which no NPU converter takes; one STRIDED_SLICE per
used output is what the NPU runs (and what only the used parts cost).
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING

from etforge.sdk import Rewrite, hookimpl, replace

if TYPE_CHECKING:
    from torch.fx import GraphModule

    from etforge.sdk import TargetSpec


class SplitToSlices(Rewrite):
    description = "split / split_with_sizes / chunk / unbind -> slice (+ squeeze for unbind)"

    def apply(self, gm: GraphModule, target: TargetSpec) -> bool:
        import torch

        from etforge.sdk import call, calls, val

        aten = torch.ops.aten
        changed = False
        ops = (
            aten.split.Tensor,
            aten.split_with_sizes.default,
            aten.chunk.default,
            aten.unbind.int,
            aten.split_copy.Tensor,
            aten.split_with_sizes_copy.default,
        )
        for node in calls(gm, *ops):
            x = node.args[0]
            parts = node.meta.get("val")
            v = val(x)
            if v is None or not isinstance(parts, (list, tuple)):
                continue
            if not all(u.op == "call_function" and u.target is operator.getitem for u in node.users):
                continue  # the list itself is used: leave it
            unbind = node.target is aten.unbind.int
            if unbind:
                dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
            else:
                dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)
            dim = int(dim) % v.dim()
            starts, pos = [], 0
            for p in parts:
                size = 1 if unbind else int(p.shape[dim])
                starts.append((pos, pos + size))
                pos += size
            for user in list(node.users):
                start, end = starts[int(user.args[1])]
                piece = call(gm, aten.slice.Tensor, (x, dim, start, end), user)
                if unbind:
                    piece = call(gm, aten.squeeze.dim, (piece, dim), user)
                replace(gm, user, piece)
                gm.graph.erase_node(user)
            changed = True
        return changed


@hookimpl
def etforge_rewrites() -> list[Rewrite]:
    return [SplitToSlices()]
