"""Partition checks: rules on whole proposed partitions, contributed by target plugins.

Some NPU limits are not about one node but about what a partition adds up to: an NPU
compiler may drop ops that compute nothing and fail on a partition left empty, or its runtime
may hand over boundary tensors in some memory layouts only. A target plugin states such rules
as :class:`PartitionCheck` objects (hook ``etforge_partition_checks``); the partitioner asks
them about every proposed partitioning and takes the nodes they refuse off the NPU, then
groups the rest again, until none is refused. The core knows no NPU's rules.

Nothing here imports torch at module level: ``etforge plugins`` lists checks cheaply.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from torch.fx import Node

    from etforge.core.contracts.target import TargetSpec


@dataclass(frozen=True)
class ProposedPartition:
    """One partition as the partitioner proposes it."""

    #: Every node in it: the delegated ops, their quantize / dequantize, getitems.
    nodes: frozenset[Node]
    #: The ops the converters accepted, in graph order (folded constants included).
    delegated: tuple[Node, ...]
    #: Whether the converter that took a node says it computes nothing on this target
    #: (``OpConverter.is_noop``, with the real constant values).
    is_noop: Callable[[Node], bool]


class PartitionCheck:
    """Base class of partition checks (modelled on ExecuTorch's ``supports_partitioning_result``).

    ``refuse(partitions, target)`` sees every proposed partition at once and returns the
    delegated nodes to keep off the NPU, each with the reason the report shows; ``{}`` accepts
    the partitioning. It runs again on the regrouped rest after each refusal.
    """

    #: Target names or NPU families (``"neutron-c"``) the check is for; ``None``: every NPU target.
    targets: ClassVar[tuple[str, ...] | None] = None
    #: One line for ``etforge plugins`` and the docs.
    description: ClassVar[str] = ""

    @property
    def name(self) -> str:
        return type(self).__name__

    def applies_to(self, target: TargetSpec) -> bool:
        if target.npu is None:
            return False
        return self.targets is None or target.name in self.targets or target.npu.family in self.targets

    def refuse(self, partitions: list[ProposedPartition], target: TargetSpec) -> dict[Node, str]:
        raise NotImplementedError
