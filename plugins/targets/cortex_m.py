"""Cortex-M33 only: CMSIS-NN ops from ``executorch.backends.cortex_m``, no proprietary SDK."""

from __future__ import annotations

from etforge.core.hookspecs import hookimpl
from etforge.core.target import TargetSpec

CORTEX_M33 = TargetSpec(
    name="cortex-m33",
    description="i.MX RT700 CPU only: CMSIS-NN kernels, runs without the eIQ Neutron SDK",
    npu=None,
    cpu_fallback="cortex_m",
    quant_schemes=("int8",),
)


@hookimpl
def etforge_targets() -> list[TargetSpec]:
    return [CORTEX_M33]
