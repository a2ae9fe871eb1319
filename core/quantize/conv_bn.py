"""prepare_pt2e's conv + BatchNorm fold, with one dead-code pass instead of one per BatchNorm.

torchao's ``fold_bn_weights_into_conv_node`` ends every fold with a whole-graph
``eliminate_dead_code``, so folding a model's BatchNorms is quadratic in its size: googlenet's
57 took ~0.5 s of a 16 s compile, almost all of it in those passes. Here torchao's own fold
runs with the per-fold pass deferred to one at the end: the same folds in the same order
(the fold reads no node a dead-code pass would remove), the same attributes, the same graph,
and ``prepare_pt2e`` then finds no BatchNorm after a conv left to fold.
"""

from __future__ import annotations

from typing import Any

from torch.fx import GraphModule


def fold_conv_batch_norms(model: GraphModule) -> None:
    """Fold every BatchNorm that follows a conv into the conv's weight and bias, in place."""
    from torchao.quantization.pt2e.utils import (
        _fuse_conv_bn_,
        _is_bn_node,
        _is_conv_or_conv_transpose_node,
    )

    graph = model.graph
    folded = [
        n for n in graph.nodes if _is_bn_node(n) and n.args and _is_conv_or_conv_transpose_node(n.args[0])
    ]
    if not folded:
        return

    def deferred(*_args: Any, **_kwargs: Any) -> bool:
        return False

    graph.eliminate_dead_code = deferred  # type: ignore[method-assign]  # this graph only
    try:
        _fuse_conv_bn_(model)
    finally:
        del graph.eliminate_dead_code
    graph.eliminate_dead_code()
    # A training-mode BatchNorm mutates its running stats, so the pass keeps it; torchao erases
    # a folded one once nothing reads it, and so does this.
    for bn in folded:
        if not bn._erased and not bn.users:
            graph.erase_node(bn)
    model.recompile()
