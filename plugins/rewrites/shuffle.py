"""Channel shuffle (ShuffleNet's 5-D view -> transpose -> view) with rank <= 4 ops and no transpose.

The NPU takes tensors of rank 4 at most. In channels-last storage the shuffle is an
interleave of the ``g`` channel groups, which slices, a concatenation along a new last
axis and reshapes express exactly, and the permutes around them only relabel the stored
layout (NCHW <-> NHWC), so the partition moves bytes once and transposes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from etforge.sdk import Rewrite, hookimpl, replace

if TYPE_CHECKING:
    from torch.fx import GraphModule, Node

    from etforge.sdk import TargetSpec


def _is(node: object, *ops: Any) -> bool:
    return getattr(node, "op", None) == "call_function" and node.target in ops  # type: ignore[union-attr]


class ChannelShuffle(Rewrite):
    description = "view(N,g,C/g,H,W) -> transpose(1,2) -> view(N,C,H,W) -> slices, cat, reshapes (rank <= 4)"

    def apply(self, gm: GraphModule, target: TargetSpec) -> bool:
        import torch

        aten = torch.ops.aten
        views = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)
        changed = False
        for last in [n for n in gm.graph.nodes if _is(n, *views, aten.flatten.using_ints)]:
            match = self._match(last, views)
            if match is not None:
                self._replace(gm, last, *match)
                changed = True
        return changed

    def _match(self, last: Node, views: tuple[Any, ...]) -> tuple[Node, int] | None:
        """(x, groups) when ``last`` closes a channel shuffle of the 4-D ``x``."""
        import torch

        from etforge.sdk import val

        aten = torch.ops.aten
        t = last.args[0]
        while _is(t, aten.contiguous.default, aten.clone.default) and len(t.users) == 1:  # type: ignore[union-attr]
            t = t.args[0]  # type: ignore[union-attr]
        if _is(t, aten.transpose.int):
            dims = sorted(int(d) % 5 for d in t.args[1:3])  # type: ignore[union-attr]
            if dims != [1, 2]:
                return None
        elif _is(t, aten.permute.default):
            if [int(d) % 5 for d in t.args[1]] != [0, 2, 1, 3, 4]:  # type: ignore[union-attr]
                return None
        else:
            return None
        first = t.args[0]  # type: ignore[union-attr]
        if not _is(first, *views) or len(t.users) != 1 or len(first.users) != 1:  # type: ignore[union-attr]
            return None
        x = first.args[0]  # type: ignore[union-attr]
        vx, v5, vout = val(x), val(first), val(last)
        if vx is None or v5 is None or vout is None or vx.dim() != 4 or v5.dim() != 5:
            return None
        n, c, h, w = vx.shape
        g, k = int(v5.shape[1]), int(v5.shape[2])
        if tuple(v5.shape) != (n, g, k, h, w) or g * k != c or tuple(vout.shape) != tuple(vx.shape):
            return None
        return x, g  # type: ignore[return-value]

    def _replace(self, gm: GraphModule, last: Node, x: Node, groups: int) -> None:
        import torch

        from etforge.sdk import call, val

        aten = torch.ops.aten
        vx = val(x)
        assert vx is not None
        n, c, h, w = (int(s) for s in vx.shape)
        k = c // groups
        nhwc = call(gm, aten.permute.default, (x, [0, 2, 3, 1]), last)
        rows = call(gm, aten.reshape.default, (nhwc, [n, h * w, c]), last)
        pieces = []
        for i in range(groups):
            part = call(gm, aten.slice.Tensor, (rows, 2, i * k, (i + 1) * k), last)
            pieces.append(call(gm, aten.unsqueeze.default, (part, 3), last))
        woven = call(gm, aten.cat.default, (pieces, 3), last)  # (n, h*w, k, groups)
        back = call(gm, aten.reshape.default, (woven, [n, h, w, c]), last)
        out = call(gm, aten.permute.default, (back, [0, 3, 1, 2]), last)
        replace(gm, last, out)


@hookimpl
def etforge_rewrites() -> list[Rewrite]:
    return [ChannelShuffle()]
