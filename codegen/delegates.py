"""Which of a ``.pte``'s delegates have a device runtime, read from the program itself.

A delegate whose payload is etforge's tagged container (:mod:`etforge.core.litert.payload`) marked
host-only is a LiteRT model that only the host runs (the eIQ Neutron SDK was absent at
compile time); the firmware build must not pretend otherwise. Any other payload is what a
device backend (``NeutronBackend`` ...) was given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from etforge.codegen import program_facts
from etforge.core.litert import payload


@dataclass(frozen=True)
class DelegateInfo:
    method: str
    backend_id: str
    #: The partition name (etforge's container, else the delegate's compile spec), else the
    #: delegate's position.
    partition: str
    format: str
    host_only: bool


def read_delegates(program: Any) -> list[DelegateInfo]:
    """Every delegate of every method of ``program`` (a ``.pte``'s parsed schema ``Program``:
    ``ProgramInfo.program``), in program order."""
    from etforge.core.serialize.pte_read import INLINE

    out = []
    for plan in program.execution_plan:
        for i, d in enumerate(plan.delegates):
            ref = d.processed
            data = (
                bytes(program.backend_delegate_data[ref.index].data)
                if ref.location == INLINE
                else b""  # segments are folded back inline by the deserializer
            )
            fmt, host_only = "device payload", False
            name = program_facts.delegate_partition(program, d) or f"{plan.name}[{i}]"
            if data[:4] == payload.MAGIC:
                blob = payload.unpack(data)
                name, fmt, host_only = blob.partition, blob.format, blob.host_only
            out.append(DelegateInfo(plan.name, d.id, name, fmt, host_only))
    return out
