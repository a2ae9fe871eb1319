"""Graph rewrites: target-aware transformations plugins contribute through ``etforge_rewrites``.

A model a user brings often spells a computation in a form the NPU does not run
(``hardsigmoid``, a 5-D channel shuffle, ``layer_norm``, ``split``) although it runs an
equivalent one. A rewrite turns the first into the second on the exported ATen graph,
*before* quantization, so the quantizer rules annotate — and the converters convert — the
rewritten form. Rewrites must preserve what the float model computes (up to float
rounding); they never change the user's numbers on purpose.

Nothing here imports torch at module level: ``etforge plugins`` lists rewrites cheaply.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch
    from torch.fx import GraphModule, Node

    from etforge.core.contracts.target import TargetSpec

#: Where a rewrite runs: ``export`` — the float ATen program (unlifted: parameters are
#: ``get_attr`` nodes), before quantization.
STAGES = ("export",)


class Rewrite:
    """Base class of graph rewrites.

    Class attributes describe the rewrite declaratively; ``apply(gm, target)`` edits the
    ``torch.fx.GraphModule`` in place and returns True when it changed anything. Each node of
    ``gm`` carries ``meta["val"]`` (a tensor of the node's shape and dtype, also for nodes an
    earlier rewrite added), so shape checks need no tracing. Leave dead nodes: the pipeline
    removes them, lints the graph and re-exports it.
    """

    #: Target names or NPU families (``"neutron-c"``) the rewrite is for; ``None``: every target.
    targets: ClassVar[tuple[str, ...] | None] = None
    #: Only on targets with an NPU (a rewrite toward NPU-friendly forms).
    npu_only: ClassVar[bool] = False
    #: See :data:`STAGES`.
    stage: ClassVar[str] = "export"
    #: Lower runs first; ties run in plugin-name, then rewrite-name order.
    order: ClassVar[int] = 0
    #: One line for ``etforge plugins`` and the docs.
    description: ClassVar[str] = ""

    @property
    def name(self) -> str:
        return type(self).__name__

    def applies_to(self, target: TargetSpec) -> bool:
        if self.npu_only and target.npu is None:
            return False
        if self.targets is None:
            return True
        family = target.npu.family if target.npu is not None else None
        return target.name in self.targets or (family is not None and family in self.targets)

    def apply(self, gm: GraphModule, target: TargetSpec) -> bool:
        raise NotImplementedError(f"rewrite {self.name} does not implement apply()")

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "stage": self.stage,
            "targets": list(self.targets) if self.targets is not None else None,
            "npu_only": self.npu_only,
            "order": self.order,
            "description": self.description,
        }


# -- helpers for writing rewrites ------------------------------------------------------------


def calls(gm: GraphModule, *ops: Any) -> list[Node]:
    """The ``call_function`` nodes of ``gm`` whose target is one of ``ops`` (OpOverloads), in order."""
    wanted = set(ops)
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in wanted]


def val(node: object) -> torch.Tensor | None:
    """The tensor a node computes (its ``meta["val"]``), or None for non-tensor values."""
    import torch

    v = getattr(node, "meta", {}).get("val")
    return v if isinstance(v, torch.Tensor) else None


def attribute(gm: GraphModule, node: object) -> torch.Tensor | None:
    """The tensor a ``get_attr`` node reads (a parameter or buffer of ``gm``); None for
    anything else."""
    import torch

    if getattr(node, "op", None) != "get_attr":
        return None
    value: Any = gm
    for atom in str(node.target).split("."):  # type: ignore[attr-defined]
        value = getattr(value, atom, None)
    return value if isinstance(value, torch.Tensor) else None


def batch_norm_affine(gm: GraphModule, bn: Node) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(scale, shift), in float64, with ``bn(x) == x * scale + shift`` per channel, of an eval
    ``batch_norm`` or ``_native_batch_norm_legit_no_training`` whose statistics (and weight
    and bias, when given) are constants; None otherwise (training, a statistic computed)."""
    import torch

    aten = torch.ops.aten
    if bn.target is aten.batch_norm.default:
        names = ("input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps")
    elif bn.target is aten._native_batch_norm_legit_no_training.default:
        names = ("input", "weight", "bias", "running_mean", "running_var", "momentum", "eps")
    else:
        return None
    given = dict(zip(names, bn.args, strict=False)) | dict(bn.kwargs)
    if given.get("training", False):
        return None
    mean, var = attribute(gm, given.get("running_mean")), attribute(gm, given.get("running_var"))
    if mean is None or var is None:
        return None
    weight = torch.ones_like(mean) if given.get("weight") is None else attribute(gm, given["weight"])
    bias = torch.zeros_like(mean) if given.get("bias") is None else attribute(gm, given["bias"])
    if weight is None or bias is None:
        return None
    scale = weight.detach().double() / torch.sqrt(var.detach().double() + float(given.get("eps", 1e-5)))
    return scale, bias.detach().double() - mean.detach().double() * scale


def batch_norm_after(gm: GraphModule, producer: Node) -> tuple[Node, torch.Tensor, torch.Tensor] | None:
    """(the batch norm, scale, shift) when ``producer``'s only user is an eval ``batch_norm`` of
    it with constant parameters (``batch_norm_affine``): ``bn(y) == y * scale + shift``."""
    import torch

    users = list(producer.users)
    if len(users) != 1:
        return None
    bn = users[0]
    if (
        bn.op != "call_function"
        or bn.target != torch.ops.aten.batch_norm.default
        or bn.args[0] is not producer
    ):
        return None
    affine = batch_norm_affine(gm, bn)
    return None if affine is None else (bn, *affine)


def constant(gm: GraphModule, value: torch.Tensor, hint: str, before: Node) -> Node:
    """A ``get_attr`` node reading ``value`` as a new buffer of ``gm``, inserted before ``before``.

    Constants become tensors (not Python scalars) so the quantizer observes and quantizes
    them like any other operand.
    """
    import re

    base = "_rw_" + re.sub(r"\W", "_", hint)
    name, i = base, 0
    while hasattr(gm, name):
        i += 1
        name = f"{base}_{i}"
    gm.register_buffer(name, value.detach().clone(), persistent=False)
    with gm.graph.inserting_before(before):
        node = gm.graph.get_attr(name)
    node.meta["val"] = value
    return node


def call(
    gm: GraphModule,
    op: Any,
    args: tuple[Any, ...],
    before: Node,
    like: Node | None = None,
    kwargs: dict[str, Any] | None = None,
) -> Node:
    """Insert ``op(*args, **kwargs)`` before ``before``; its ``meta["val"]`` is computed from
    the arguments'."""
    import torch

    with gm.graph.inserting_before(before):
        node = gm.graph.call_function(op, args, kwargs or {})
    src = like if like is not None else before
    for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
        if key in src.meta:
            node.meta[key] = src.meta[key]
    concrete = torch.fx.node.map_arg(args, lambda n: n.meta.get("val"))
    concrete_kwargs = torch.fx.node.map_arg(kwargs or {}, lambda n: n.meta.get("val"))
    with torch.no_grad():
        node.meta["val"] = op(*concrete, **concrete_kwargs)
    return node


def replace(gm: GraphModule, old: Node, new: Node) -> Node:
    """Hand ``old``'s users ``new`` instead, laid out in memory as ``old`` was; returns what
    they now read.

    ``torch.export`` leaves out a ``.contiguous()`` that was a no-op on the traced strides, so
    a ``view`` downstream can depend on them: HF's ViT views SDPA's output, which follows its
    query's layout, after a permute. A replacement with other strides (the matmuls SDPA is made
    of give a contiguous result) gets a permute, a contiguous clone and the inverse permute,
    which the NPU's layout moves absorb.
    """
    import torch

    was, now = val(old), val(new)
    out = new
    if (
        was is not None
        and now is not None
        and was.shape == now.shape
        and _strides(was) != _strides(now)
        and not _views_hold(old, now)
    ):
        aten = torch.ops.aten
        # outermost first: the permutation whose contiguous copy has ``old``'s memory order
        order = sorted(range(was.dim()), key=lambda d: (-was.stride()[d], d))
        if not _dense_in(was, order):  # overlapping or gapped (an expand): nothing to match
            old.replace_all_uses_with(new)
            return new
        inverse = sorted(range(was.dim()), key=order.__getitem__)
        out = call(gm, aten.permute.default, (new, order), old)
        out = call(gm, aten.clone.default, (out,), old, kwargs={"memory_format": torch.contiguous_format})
        out = call(gm, aten.permute.default, (out, inverse), old)
    old.replace_all_uses_with(out)
    return out


def _views_hold(old: Node, now: torch.Tensor) -> bool:
    """Whether every chain of view ops reading ``old`` still runs on ``now``'s strides."""
    import torch

    values: dict[Node, torch.Tensor] = {old: now}
    pending = list(old.users)
    while pending:
        user = pending.pop(0)
        if user in values or not _is_view_op(user) or not user.args or user.args[0] not in values:
            continue
        rest = torch.fx.node.map_arg(user.args[1:], lambda n: n.meta.get("val"))
        try:
            with torch.no_grad():
                values[user] = user.target(values[user.args[0]], *rest, **user.kwargs)
        except RuntimeError:
            return False
        pending.extend(user.users)
    return True


def _is_view_op(node: Node) -> bool:
    target = node.target
    return node.op == "call_function" and bool(getattr(target, "is_view", False))


def _dense_in(t: torch.Tensor, order: list[int]) -> bool:
    expected = 1
    for d in reversed(order):
        if t.shape[d] != 1 and t.stride()[d] != expected:
            return False
        expected *= t.shape[d]
    return True


def _strides(t: torch.Tensor) -> tuple[int, ...]:
    """The strides a view can depend on: those of dims longer than 1."""
    return tuple(s for s, n in zip(t.stride(), t.shape, strict=True) if n != 1)


def annotate_values(gm: GraphModule, example: tuple[Any, ...]) -> None:
    """Run ``gm`` once on ``example`` and store each node's output in ``meta["val"]``."""
    import torch

    class _Record(torch.fx.Interpreter):
        def run_node(self, n: Node) -> Any:
            out = super().run_node(n)
            if n.op != "output":
                n.meta["val"] = out
            return out

    with torch.no_grad():
        _Record(gm).run(*example)
