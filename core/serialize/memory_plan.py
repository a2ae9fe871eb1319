"""Arena planning: ExecuTorch's memory-planning suite with one more algorithm to choose from.

ExecuTorch's ``greedy`` packs tensors into whole shared buckets, which strands bytes when a
small tensor's bucket outlives it. ``best_fit`` places each tensor at the lowest offset that no
tensor alive at the same time occupies (TFLite Micro's greedy-by-size planner), trying a
few orders (largest first, execution order, largest footprint first). ExecuTorch's ``MemoryPlanningAlgorithmSuite`` runs both and keeps the smaller plan,
so the arena never grows.
"""

from __future__ import annotations

from typing import Any

import torch
from executorch.exir.memory_planning import (
    AllocationSpec,
    MemoryAlgoResult,
    MemoryPlanningAlgorithmSuite,
    SharedObject,
    SpecAllocResult,
    _compute_total_sizes,
    _resolve_storage_base_specs,
    greedy,
)
from executorch.exir.passes.memory_planning_pass import MemoryPlanningPass

from etforge.core.serialize.placement import _ORDERS, _place


def best_fit(
    alignment: int,
    specs: set[Any],
    graph_module: torch.fx.GraphModule,
    graph_signature: Any,
    extra_padding: int = 0,
) -> MemoryAlgoResult:
    """Offset placement (TFLite Micro style) under a few orders; the smallest arena wins."""
    result = MemoryAlgoResult({}, [])
    deferred, direct = [], []
    for spec in specs:
        result.spec_dict[spec] = SpecAllocResult(1 if spec.mem_id is None else spec.mem_id, 0, 0)
        spec.realign(alignment)
        (deferred if spec.storage_base is not None else direct).append(spec)

    def arena(offsets: dict[Any, int]) -> int:
        return sum(
            max((off + int(sp.allocated_memory) for sp, off in offsets.items() if sp.mem_id == m), default=0)
            for m in {sp.mem_id for sp in offsets}
        )

    plans = [_place(sorted(direct, key=key), alignment) for key in _ORDERS]
    offsets = min(plans, key=arena)  # first of equals: deterministic
    objects: dict[int, SharedObject] = {}
    spec2obj: dict[Any, SharedObject] = {}
    for spec in sorted(direct, key=_ORDERS[0]):
        mem_id = result.spec_dict[spec].mem_id
        start, end = spec.lifetime
        obj = objects.get(mem_id)
        if obj is None:
            obj = objects[mem_id] = SharedObject(0, -1, 0, start, end)
        obj.size = max(obj.size, offsets[spec] + int(spec.allocated_memory))
        obj.first_used_index, obj.last_used_index = (
            min(obj.first_used_index, start),
            max(obj.last_used_index, end),
        )
        obj.allocations.append(AllocationSpec(offsets[spec], spec))
        spec2obj[spec] = obj
    _resolve_storage_base_specs(deferred, spec2obj, result)
    shared = {mem_id: [obj] for mem_id, obj in sorted(objects.items())}
    result.bufsizes = _compute_total_sizes(shared, graph_module, extra_padding, result, len(spec2obj))
    return result


def planning_pass() -> MemoryPlanningPass:
    """ExecuTorch's planning pass choosing the smaller of its ``greedy`` and ``best_fit``."""
    return MemoryPlanningPass(memory_planning_algo=MemoryPlanningAlgorithmSuite([greedy, best_fit]))
