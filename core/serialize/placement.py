"""Best-fit offset placement of tensors with known lifetimes (no torch: the NPU partitions'
planner and ``codegen`` use it too; ``memory_plan`` wraps it into an ExecuTorch algorithm)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any


def _align(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


#: Orders tried for placement; each is a sort key over TensorSpecs (all deterministic).
_ORDERS = (
    lambda s: (-int(s.allocated_memory), s.lifetime[0], s.lifetime[1]),  # largest first
    lambda s: (s.lifetime[0], -int(s.allocated_memory), s.lifetime[1]),  # in execution order
    lambda s: (-int(s.allocated_memory) * (s.lifetime[1] - s.lifetime[0] + 1), s.lifetime[0]),
)


def _place(specs: list[Any], alignment: int) -> dict[Any, int]:
    """Each spec at the lowest aligned offset free of the specs placed before it that are
    alive at the same time (per memory id)."""
    placed: dict[int, list[tuple[int, int, int, int]]] = defaultdict(list)  # offset, size, start, end
    offsets = {}
    for spec in specs:
        mem_id = 1 if spec.mem_id is None else spec.mem_id
        size, (start, end) = int(spec.allocated_memory), spec.lifetime
        offset = 0
        for o, sz, _, _ in sorted(p for p in placed[mem_id] if not (end < p[2] or start > p[3])):
            if offset + size <= o:
                break
            offset = max(offset, _align(o + sz, alignment))
        placed[mem_id].append((offset, size, start, end))
        offsets[spec] = offset
    return offsets
