"""prepare_pt2e's conv + BatchNorm fold: exact on every graph, one dead-code pass.

torchao's fold (``_fuse_conv_bn_``) has two faults this module exists to avoid:

- It is quadratic: every fold ends with a whole-graph ``eliminate_dead_code`` (googlenet's 57
  folds took ~0.5 s of a 16 s compile). Here the pass runs once, at the end.
- It changes what some models compute. It rewrites the conv's weight in place, so a conv
  whose output also feeds something other than the BatchNorm (a tap, a second BatchNorm)
  hands that user the folded output; and once a weight is folded it "fake fuses" every
  later BatchNorm on a conv reading that weight — a second BatchNorm in a chain, or a
  weight-shared conv with its own BatchNorm — dropping it without folding it.

So each fold here first makes sure it changes only what it should: a conv with other users
gets a copy (its own node and weights) for the BatchNorm; a weight shared with convs that
will not fold the same BatchNorm next is copied for this conv. A weight shared by convs that
all fold the same BatchNorm (one module called twice) is folded once and shared on, as
torchao does. On graphs torchao folds correctly (one conv, one BatchNorm) the result is
torchao's, tensor for tensor. A BatchNorm after a linear is still torchao's fold, in
``prepare_pt2e`` (core names no op beyond what torchao's conv fold does).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.fx import GraphModule, Node

from etforge.core.contracts.rewrite import attribute

#: A BatchNorm's identity for sharing: its parameter attributes and eps.
_BnKey = tuple[Any, ...]


def fold_conv_batch_norms(model: GraphModule) -> None:
    """Fold every BatchNorm after a conv into the conv's weights, in place, exactly."""
    from torchao.quantization.pt2e.utils import _is_bn_node, fold_bn_weights_into_conv_node

    graph = model.graph
    if not any(_is_bn_node(n) for n in graph.nodes):
        return
    folded_into: dict[Node, tuple[_BnKey, ...]] = {}  # per conv node: what its weight holds
    weight_holds: dict[str, tuple[_BnKey, ...]] = {}  # per weight attribute: what it holds
    folded: list[Node] = []

    def deferred(*_args: Any, **_kwargs: Any) -> bool:
        return False

    graph.eliminate_dead_code = deferred  # type: ignore[method-assign]  # this graph only
    try:
        for bn in list(graph.nodes):
            if bn._erased or not _is_bn_node(bn) or not bn.args:
                continue
            layer = bn.args[0]
            if not _foldable(layer):
                continue
            key = _bn_key(bn)
            layer = _exclusive(model, layer, bn, key, folded_into, weight_holds)
            weight = str(layer.args[1].target)
            expected = folded_into.get(layer, ()) + (key,)
            fake = weight_holds.get(weight, ()) == expected  # a sharer folded this one already
            bias = layer.args[2] if len(layer.args) > 2 else None
            fold_bn_weights_into_conv_node(layer, layer.args[1], bias, bn, model, fake)
            folded_into[layer] = weight_holds[weight] = expected
            folded.append(bn)
    finally:
        del graph.eliminate_dead_code
    graph.eliminate_dead_code()
    # A training-mode BatchNorm mutates its running stats, so the pass keeps it; torchao erases
    # a folded one once nothing reads it, and so does this.
    for bn in folded:
        if not bn._erased and not bn.users:
            graph.erase_node(bn)
    model.recompile()


def _foldable(layer: Any) -> bool:
    from torchao.quantization.pt2e.utils import _is_conv_or_conv_transpose_node

    return (
        isinstance(layer, Node) and _is_conv_or_conv_transpose_node(layer) and _weights_are_attributes(layer)
    )


def _weights_are_attributes(layer: Node) -> bool:
    params = [a for a in layer.args[1:3] if a is not None]
    return len(layer.args) > 1 and all(isinstance(a, Node) and a.op == "get_attr" for a in params)


def _bn_key(bn: Node) -> _BnKey:
    return tuple(a.target if isinstance(a, Node) else a for a in bn.args[1:])


def _exclusive(
    model: GraphModule,
    layer: Node,
    bn: Node,
    key: _BnKey,
    folded_into: dict[Node, tuple[_BnKey, ...]],
    weight_holds: dict[str, tuple[_BnKey, ...]],
) -> Node:
    """The layer node ``bn`` may fold into without changing any other value of the graph."""
    if len(layer.users) > 1:  # others read the unfolded output: the BatchNorm gets a copy
        copy = model.graph.node_copy(layer)
        layer.append(copy)
        bn.replace_input_with(layer, copy)
        folded_into[copy] = folded_into.get(layer, ())
        _own_weights(model, copy)
        return copy
    weight = str(layer.args[1].target)
    sharers = [n for n in _readers(model, weight) if n is not layer]
    expected = folded_into.get(layer, ()) + (key,)
    if sharers and not (
        weight_holds.get(weight, ()) == expected or _all_fold_next(sharers, key, folded_into, layer)
    ):
        _own_weights(model, layer)
    return layer


def _readers(model: GraphModule, weight: str) -> list[Node]:
    return [u for n in model.graph.nodes if n.op == "get_attr" and n.target == weight for u in n.users]


def _all_fold_next(
    sharers: list[Node], key: _BnKey, folded_into: dict[Node, tuple[_BnKey, ...]], layer: Node
) -> bool:
    """Whether every other reader of the weight is a layer that will fold this same BatchNorm next."""
    from torchao.quantization.pt2e.utils import _is_bn_node

    mine = folded_into.get(layer, ())
    for sharer in sharers:
        users = list(sharer.users)
        if folded_into.get(sharer, ()) != mine or len(users) != 1:
            return False
        if not _is_bn_node(users[0]) or users[0].args[0] is not sharer or _bn_key(users[0]) != key:
            return False
    return True


def _own_weights(model: GraphModule, layer: Node) -> None:
    """Give ``layer`` private copies of its weight and bias attributes (their current values)."""
    args = list(layer.args)
    for i in (1, 2):
        if i < len(args) and isinstance(args[i], Node):
            source = args[i]
            name = _free_name(model, str(source.target).replace(".", "_") + "_bn_fold")
            value = attribute(model, source)
            assert value is not None  # _foldable: every weight is a get_attr of a tensor
            model.register_parameter(name, torch.nn.Parameter(value.detach().clone(), requires_grad=False))
            with model.graph.inserting_before(layer):
                node = model.graph.get_attr(name)
            node.meta = dict(source.meta)
            args[i] = node
    layer.args = tuple(args)


def _free_name(model: GraphModule, base: str) -> str:
    index = 0
    while hasattr(model, f"{base}_{index}"):
        index += 1
    return f"{base}_{index}"
