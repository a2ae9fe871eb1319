"""What memory planning gave: arena bytes per memory id, the lower bound, scratch buffers.

The lower bound is the peak, over the execution schedule, of the bytes of activations
(kernels' scratch buffers included) alive at once: no plan can use less arena than that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from etforge.core.common.errors import EtforgeError


@dataclass
class MemoryStats:
    arena_bytes: list[int]  # per memory id 1..n
    lower_bound: int
    peak_step: int
    peak_nodes: list[str]  # what is alive at the peak, largest first
    constant_bytes: int  # the program's own constant tensors as serialized (CPU weights)
    scratch: list[dict[str, Any]] = field(default_factory=list)
    #: NPU payloads (weights, microcode, kernels): in flash beside the constants.
    delegate_bytes: int = 0

    @property
    def flash_bytes(self) -> int:
        return self.constant_bytes + self.delegate_bytes

    @property
    def ratio(self) -> float:
        return (sum(self.arena_bytes) / self.lower_bound) if self.lower_bound else 1.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "arena_bytes": self.arena_bytes,
            "lower_bound_bytes": self.lower_bound,
            "arena_over_lower_bound": round(self.ratio, 4),
            "peak_step": self.peak_step,
            "peak_live": self.peak_nodes[:8],
            "constant_bytes": self.constant_bytes,
            "delegate_bytes": self.delegate_bytes,
            "flash_bytes": self.flash_bytes,
            "scratch": self.scratch,
        }


def memory_stats(executorch_manager: Any) -> MemoryStats:
    program = executorch_manager.executorch_program
    plan = program.execution_plan[0]
    graph = executorch_manager.exported_program().graph
    intervals: list[tuple[int, int, int, str]] = []
    # What the emitter serialized: the graph also keeps constants no node uses any more
    # (weights a Cortex-M pass replaced by their NHWC copy), which never reach the .pte.
    constant = sum(len(buffer.storage) for buffer in program.constant_buffer)
    scratch = []
    seen: set[int] = set()  # an out-variant op and the alloc it writes share one TensorSpec
    for node in graph.nodes:
        specs = node.meta.get("spec")
        for spec in specs if isinstance(specs, (list, tuple)) else [specs]:
            if spec is None or not hasattr(spec, "lifetime") or id(spec) in seen:
                continue
            seen.add(id(spec))
            size = int(getattr(spec, "allocated_memory", 0) or 0)
            if getattr(spec, "const", False):
                continue
            if spec.mem_id is None or spec.lifetime[0] is None:
                continue
            intervals.append((int(spec.lifetime[0]), int(spec.lifetime[1]), size, _label(node)))
        if node.op == "call_function":
            # A kernel's work buffer is an anonymous byte buffer passed as an argument (the
            # outputs it writes are ``out=`` keywords): ExecuTorch's convention, any backend.
            for arg in node.args:
                if _is_scratch(arg):
                    scratch.append(
                        {"node": node.name, "op": str(node.target), "bytes": int(arg.args[0][0][0])}
                    )
    peak, peak_step, peak_nodes = 0, 0, []
    steps = sorted({s for s, _, _, _ in intervals})
    for t in steps:
        live = [(size, name) for s, e, size, name in intervals if s <= t <= e]
        total = sum(size for size, _ in live)
        if total > peak:
            peak, peak_step = total, t
            peak_nodes = [name for _, name in sorted(live, reverse=True)]
    gm = executorch_manager.exported_program().graph_module
    delegates = sum(
        len(mod.processed_bytes)
        for node in graph.nodes
        if node.op == "get_attr" and hasattr(mod := getattr(gm, str(node.target), None), "processed_bytes")
    )
    return MemoryStats(
        [int(b) for b in plan.non_const_buffer_sizes[1:]],
        peak,
        peak_step,
        peak_nodes,
        constant,
        scratch,
        delegate_bytes=delegates,
    )


def _label(node: Any) -> str:
    """Name a planned buffer after the op that fills it (an alloc is anonymous)."""
    if getattr(node.target, "__name__", "") != "alloc":
        return node.name
    for user in node.users:
        if user.kwargs.get("out") is node:
            return user.name
        if node in user.args:
            return f"{user.name} (scratch)"
    return node.name


def _is_scratch(arg: Any) -> bool:
    """An ``exir.memory.alloc`` of a 1-D uint8 buffer."""
    if getattr(arg, "op", None) != "call_function" or getattr(arg.target, "__name__", "") != "alloc":
        return False
    spec = arg.args[0] if arg.args else None
    return isinstance(spec, tuple) and len(spec) == 2 and len(spec[0]) == 1 and "uint8" in str(spec[1])


def check_budget(stats: MemoryStats, budget: int | None, npu: Sequence[Any] = ()) -> None:
    """The arena, and the arena beside each NPU partition's working memory (``npu``:
    ``core.serialize.npu_memory`` plans; partitions run one at a time), within ``budget`` bytes."""
    if budget is None:
        return
    arena = sum(stats.arena_bytes)
    if arena > budget:
        live = ", ".join(stats.peak_nodes[:4])
        raise EtforgeError(
            f"planned arena {arena:,} B does not fit the memory budget {budget:,} B; "
            f"peak live memory {stats.lower_bound:,} B at step {stats.peak_step}, held by {live}"
        )
    for part in sorted(npu, key=lambda p: (-p.working_bytes, p.name)):
        if arena + part.working_bytes > budget:
            raise EtforgeError(
                f"NPU partition {part.name}: working memory {part.working_bytes:,} B beside the planned "
                f"arena {arena:,} B ({arena + part.working_bytes:,} B) does not fit the memory budget "
                f"{budget:,} B ({part.source})"
            )
