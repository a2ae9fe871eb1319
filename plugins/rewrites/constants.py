"""Tensors whose values come from no input value, made constants before quantization.

``zeros_like(x)``, ``ones_like(x)``, ``full_like(x, v)``, ``fill(x, v)``, ``new_zeros``,
``full``, ``zeros``, ``ones``, ``scalar_tensor``, ``arange``: the input, if any, gives only
the shape. PT2E quantizes such an op like a layout op (its output shares its input's
qparams), and a CPU backend that folds Q/DQ into the ops between them (ExecuTorch's
Cortex-M passes) then runs it on the int8 input: ``full_like(x_int8, 0)`` is int8 ``0``,
which means ``(0 - zero_point) * scale``, not ``0.0``. As a constant buffer the tensor is
quantized once, at convert time, with its consumer's qparams (``0.0`` becomes the zero
point), and the int8 program reads it.

On a target with an NPU the constant is folded too, whatever the CPU backend: ``x *
torch.ones(...)`` built in ``forward`` would otherwise run ``aten.full`` on the CPU and enter
the NPU partition as an input (ExecuTorch's NXP flow folds it as well).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from etforge.sdk import Rewrite, hookimpl

if TYPE_CHECKING:
    from torch.fx import GraphModule, Node

    from etforge.sdk import TargetSpec


def _value_ops() -> tuple[frozenset[object], frozenset[object]]:
    """(ops whose first argument gives only a shape, ops with no tensor argument)."""
    import torch

    aten = torch.ops.aten
    like = frozenset(
        {
            aten.zeros_like.default,
            aten.ones_like.default,
            aten.full_like.default,
            aten.fill.Scalar,
            aten.new_zeros.default,
            aten.new_ones.default,
            aten.new_full.default,
        }
    )
    free = frozenset(
        {
            aten.zeros.default,
            aten.ones.default,
            aten.full.default,
            aten.scalar_tensor.default,
            aten.arange.default,
            aten.arange.start,
            aten.arange.start_step,
        }
    )
    return like, free


def _static(args: object) -> bool:
    """No argument is computed by the graph (a symbolic size would be a node)."""
    from torch.fx.node import map_aggregate

    found: list[object] = []
    map_aggregate(args, lambda a: found.append(a) if type(a).__name__ == "Node" else None)
    return not found


class ValueOpsAsConstants(Rewrite):
    description = (
        "zeros_like/ones_like/full_like/fill/new_*/full/zeros/ones/scalar_tensor/arange of a "
        "static shape -> a constant tensor (quantized with its consumer's qparams), on targets "
        "with an NPU and on CPU backends that fold Q/DQ into ops"
    )

    def applies_to(self, target: TargetSpec) -> bool:
        from etforge.sdk import registry

        if target.npu is not None:  # else the CPU computes it and the partition takes it as an input
            return True
        # A target whose CPU backend is not loaded fails here, naming it (as its compile would).
        return bool(getattr(registry().cpu_backend(target), "folds_qdq", False))

    def apply(self, gm: GraphModule, target: TargetSpec) -> bool:
        import torch

        from etforge.sdk import constant, val

        like, free = _value_ops()
        changed = False
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or (node.target not in like and node.target not in free):
                continue
            out = val(node)
            if out is None or not out.is_floating_point():
                continue  # integer and bool tensors are not quantized: the op computes them right
            if node.target in like:
                first: Node = node.args[0]
                if val(first) is None or not _static((node.args[1:], node.kwargs)):
                    continue
                args = (val(first), *node.args[1:])
            else:
                if not _static((node.args, node.kwargs)):
                    continue
                args = node.args
            with torch.no_grad():
                value = node.target(*args, **node.kwargs)
            node.replace_all_uses_with(constant(gm, value.contiguous(), node.name, node))
            changed = True
        return changed


@hookimpl
def etforge_rewrites() -> list[Rewrite]:
    return [ValueOpsAsConstants()]
