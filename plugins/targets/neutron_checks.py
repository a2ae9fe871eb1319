"""Neutron's partition-level rules, as partition checks (``etforge_partition_checks``).

ExecuTorch's NXP backend validates each proposed partitioning (``neutron_partitioner.py``
``validate_partitioning_result`` and the converters' ``supports_partitioning_result``). Two
of its rules are about partitions, not nodes, and are re-expressed here, each switched on by
a ``requires`` flag of the target's NPU spec:

- ``partition_needs_compute``: the Neutron compiler drops ops that compute nothing (a view, a
  clone, a size-1 permute, a scale-1 resize, x + 0 ...); a partition of such ops only would
  compile to an empty graph, so it stays on the CPU.
- ``clone_boundary_dim_orders``: a clone at a partition boundary must see a contiguous or
  channels-last tensor, the only layouts the Neutron runtime hands over.

A third, ``max_tensor_rank``, is per node but holds for every op, whichever converter took it:
no tensor on the NPU has more dims than the limit (upstream builds none past rank 7).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from etforge.sdk import PartitionCheck, ProposedPartition

if TYPE_CHECKING:
    from torch.fx import Node

    from etforge.sdk import TargetSpec

#: Clone-like ops whose partition-boundary tensors the NPU runtime must see in a plain layout.
_CLONES = {"aten.clone.default", "dim_order_ops._clone_dim_order.default"}


class NeedsCompute(PartitionCheck):
    description = "no partition of no-op ops only (npu partition_needs_compute)"

    def refuse(self, partitions: list[ProposedPartition], target: TargetSpec) -> dict[Node, str]:
        from etforge.sdk import is_constant, node_op

        npu = target.npu
        if npu is None or not npu.requirement("partition_needs_compute"):
            return {}
        out: dict[Node, str] = {}
        for p in partitions:
            compute = [n for n in p.delegated if not is_constant(n)]  # folded weights don't count
            if all(p.is_noop(n) for n in compute):  # folded constants alone compute nothing too
                ops = sorted({node_op(n) for n in p.delegated})
                why = (
                    f"partition of no-op ops only ({', '.join(ops)}): the {npu.family} NPU "
                    "compiler drops them, leaving nothing to run"
                )
                out.update(dict.fromkeys(p.delegated, why))
        return out


class CloneBoundaryDimOrder(PartitionCheck):
    description = "a clone at a partition boundary sees a contiguous or channels-last tensor"

    def refuse(self, partitions: list[ProposedPartition], target: TargetSpec) -> dict[Node, str]:
        from etforge.sdk import dim_order, is_dequantize, is_quantize, node_op

        if target.npu is None or not target.npu.requirement("clone_boundary_dim_orders"):
            return {}
        bad: dict[Node, str] = {}
        for p in partitions:
            for node in p.delegated:
                if node_op(node) not in _CLONES:
                    continue
                rank = len(node.meta["val"].shape)
                plain = {tuple(range(rank)), (0, *range(2, rank), 1) if rank > 1 else (0,)}
                src = node.args[0]
                while is_dequantize(src) or is_quantize(src):
                    src = src.args[0]
                ends = []
                if src not in p.nodes:
                    ends.append(("input", node.args[0]))
                outs = [x for u in node.users for x in (u.users if is_quantize(u) else [u])]
                outs = [x for u in outs for x in (u.users if is_dequantize(u) else [u])]
                if any(u not in p.nodes for u in outs):
                    ends.append(("output", node))
                for side, t in ends:
                    order = dim_order(t)
                    if order not in plain:
                        bad[node] = (
                            f"partition {side} dim order {list(order)} is neither contiguous nor "
                            "channels-last (npu clone_boundary_dim_orders)"
                        )
        return bad


class TensorRank(PartitionCheck):
    description = "no tensor on the NPU above rank npu max_tensor_rank"

    def refuse(self, partitions: list[ProposedPartition], target: TargetSpec) -> dict[Node, str]:
        npu = target.npu
        if npu is None or "max_tensor_rank" not in npu.limits:
            return {}
        limit = npu.limit("max_tensor_rank", 0)
        out: dict[Node, str] = {}
        for p in partitions:
            for node in p.delegated:
                ranks = [_rank(node), *(_rank(a) for a in node.all_input_nodes)]
                worst = max(r for r in ranks if r is not None) if any(r is not None for r in ranks) else 0
                if worst > limit:
                    out[node] = (
                        f"a rank-{worst} tensor: the {npu.family} NPU takes rank <= {limit} (npu max_tensor_rank)"
                    )
        return out


def _rank(node: Node) -> int | None:
    val = node.meta.get("val")
    shape = getattr(val, "shape", None)
    return len(shape) if shape is not None else None
