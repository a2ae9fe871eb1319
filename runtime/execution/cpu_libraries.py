"""The CPU libraries' own kernels on the host, asked of their CPU backend plugins.

A CPU backend that brings a kernel library of its own (CMSIS-NN's ``cortex_m::`` ops) gives
its host arithmetic through ``CpuBackend.host_arithmetic`` and its dim-order rules through
``CpuBackend.dim_order_problem``; runtime finds the library of an op by its namespace
(``CpuBackend.kernel_namespaces``) and never names one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from etforge.core.contracts.cpu_backend import HostArithmetic, KernelArg
from etforge.core.registry.manager import Registry, registry


@lru_cache(maxsize=4)
def _libraries(reg: Registry) -> dict[str, HostArithmetic]:
    out: dict[str, HostArithmetic] = {}
    for backend in reg.cpu_backends.values():
        arithmetic = backend.host_arithmetic()
        if arithmetic is None:
            continue
        if arithmetic.register is not None:
            arithmetic.register()
        for ns in backend.kernel_namespaces:
            out.setdefault(ns, arithmetic)
    return out


def host_libraries() -> dict[str, HostArithmetic]:
    """Op namespace -> the host arithmetic of the CPU library that owns it (each loaded plugin's)."""
    return _libraries(registry())


def host_library(namespace: str) -> HostArithmetic | None:
    """The host arithmetic of the library owning op namespace ``namespace`` (``cortex_m``), if any."""
    return host_libraries().get(namespace)


def host_kernel(op: str) -> Callable[..., Any] | None:
    """A CPU library's own out-variant kernel for operator ``op`` (``ns::name``), if it has one."""
    ns = op.partition("::")[0]
    library = host_library(ns)
    return None if library is None else library.kernels.get(op)


def argument_reads(op: str, names: tuple[str, ...]) -> tuple[str, ...]:
    """How the host kernel of ``op`` (``ns::name``) reads each argument in ``names``:
    ``"whole"``, ``"bytes"`` or ``"unread"`` (``HostArithmetic.reads``)."""
    library = host_library(op.partition("::")[0])
    reads = library.reads.get(op, {}) if library is not None else {}
    return tuple(reads.get(n, "whole") for n in names)


def not_proven() -> dict[str, str]:
    """Operator -> why its host kernel is not proven equal to the device, over every library."""
    return {op: why for lib in host_libraries().values() for op, why in lib.not_proven.items()}


def dim_order_problem(op: str, args: Sequence[KernelArg]) -> str | None:
    """The first CPU backend's reason why the device's kernel for ``op`` would refuse or
    miscompute a call with these dim orders (None: every backend accepts it)."""
    for backend in registry().cpu_backends.values():
        why = backend.dim_order_problem(op, args)
        if why is not None:
            return why
    return None
