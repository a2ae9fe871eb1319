"""Where NPU partitions meet CPU code: layout conversions and the dim orders both sides use.

An NPU partition reads and writes raw buffers, so the bytes order its LiteRT tensors assume
must be the ExecuTorch dim order the ``.pte`` gives those tensors; a mismatch would compute
garbage on the device while every host check passed. ``check_delegate_dim_orders`` proves the
agreement on the serialized program; ``layout_conversions`` lists the CPU-side copies that
only move data between layouts (what the NHWC-everywhere Cortex-M lowering keeps at zero).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from torch.export import ExportedProgram
from torch.fx import Node

from etforge.core.common.errors import EtforgeError
from etforge.core.graph.utils import dim_order, node_op, tensor_meta

if TYPE_CHECKING:
    from executorch.exir.schema import Program

#: CPU ops that move data between layouts without computing anything.
_LAYOUT_OPS = (
    "aten.permute",
    "aten.permute_copy",
    "aten.transpose",
    "aten.transpose_copy",
    "aten.t_copy",
    "dim_order_ops._clone_dim_order",
    "dim_order_ops._to_dim_order_copy",
    "aten.clone",
    "aten._to_copy",
)


def _moves_layout(node: Node, permutes: tuple[str, ...] = ()) -> bool:
    src = node.args[0] if node.args else None
    if not isinstance(src, Node) or tensor_meta(src) is None or tensor_meta(node) is None:
        return False
    op = node_op(node)
    if op.startswith(("aten.permute", "aten.transpose", "aten.t_copy", *permutes)):
        return not all(s == 1 for s in tensor_meta(src).shape[:-1])  # a real data move
    return dim_order(src) != dim_order(node)  # copies count only when the dim order changes


def layout_conversions(ep: ExportedProgram, permutes: tuple[str, ...] = ()) -> list[str]:
    """Names of the CPU nodes (outside delegates) that convert a tensor's layout.

    ``permutes``: the CPU backend's own transpose kernels (``CpuBackend.layout_ops``).
    """
    ops = (*_LAYOUT_OPS, *permutes)
    return [
        n.name
        for n in ep.graph_module.graph.nodes
        if n.op == "call_function" and node_op(n).rsplit(".", 1)[0] in ops and _moves_layout(n, permutes)
    ]


def check_delegate_dim_orders(
    pte: bytes | Program, expected: Sequence[tuple[str, list[list[int]], list[list[int]]]]
) -> None:
    """Raise unless each delegate call of ``pte`` passes tensors in the dim orders its partition
    was built for. ``expected``: (partition name, input dim orders, output dim orders) per
    delegate call, in program order; ``pte`` may be its already deserialized ``Program``."""
    from executorch.exir._serialize._program import deserialize_pte_binary
    from executorch.exir.schema import DelegateCall, Tensor

    program = deserialize_pte_binary(pte).program if isinstance(pte, bytes) else pte
    calls = [
        (plan, instr.instr_args)
        for plan in program.execution_plan
        for chain in plan.chains
        for instr in chain.instructions
        if isinstance(instr.instr_args, DelegateCall)
    ]
    if len(calls) != len(expected):
        raise EtforgeError(
            f"the program has {len(calls)} delegate calls; {len(expected)} partitions were built"
        )
    for (plan, call), (name, ins, outs) in zip(calls, expected, strict=True):
        tensors = [plan.values[i].val for i in call.args]
        tensors = [t for t in tensors if isinstance(t, Tensor)]
        want = list(ins) + list(outs)
        got = [[int(d) for d in t.dim_order] for t in tensors]
        if got != [list(d) for d in want]:
            raise EtforgeError(
                f"partition {name}: the program lays out its I/O in dim orders {got}, the partition "
                f"was built for {want} (the device would read the buffers in the wrong order)"
            )
