"""A third-party CPU library as a plugin, with no edit to etforge (issue 44): ``doublelib``.

One op namespace (``doublelib::``) with one kernel (``relu``), its kernel-library entry
(``doublelib.yaml``: what the kernel check and codegen read), its host arithmetic (what
``etforge verify`` runs the op on) and its dim-order rule, a CPU backend whose lowering puts
the op in the program, and a target using that backend. It imports only ``etforge.sdk``.
``tests/test_cpu_library_plugin.py`` loads it the way an installed plugin loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from etforge.sdk import CpuBackend, HostArithmetic, KernelArg, KernelLibrary, TargetSpec, hookimpl

HERE = Path(__file__).resolve().parent
NAMESPACE = "doublelib"

_LIB = torch.library.Library(NAMESPACE, "FRAGMENT")
if not hasattr(torch.ops.doublelib, "relu"):
    _LIB.define("relu(Tensor x) -> Tensor")
    _LIB.define("relu.out(Tensor x, *, Tensor(a!) out) -> Tensor(a!)")
    # shapes only (tracing, memory planning): the values come from the host arithmetic below
    torch.library.register_fake("doublelib::relu")(lambda x: torch.empty_like(x))
    torch.library.register_fake("doublelib::relu.out")(lambda x, *, out: out)

#: The library's operator list, an absolute path (not inside the executorch package).
DOUBLELIB = KernelLibrary("doublelib", "doublelib (doublelib::)", str(HERE / "doublelib.yaml"))
#: ExecuTorch's own libraries, which this backend also links (for the ops it does not take).
EXECUTORCH = (
    KernelLibrary("portable", "ExecuTorch portable", "kernels/portable/functions.yaml"),
    KernelLibrary("et_copy", "ExecuTorch copy/dim-order", "kernels/portable/et_copy_ops.yaml"),
)

#: Calls of the host kernel (the test reads it: verify ran this library's arithmetic).
CALLS = [0]


def relu_out(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The device kernel's arithmetic on the host: ``max(x, 0)`` element by element."""
    CALLS[0] += 1
    return out.copy_(torch.clamp_min(x, 0.0))


class DoubleLibBackend(CpuBackend):
    name = NAMESPACE
    description = "test CPU library: doublelib::relu, then ExecuTorch's portable kernels"
    placement = "doublelib"
    kernel_libraries = (DOUBLELIB, *EXECUTORCH)
    kernel_namespaces = (NAMESPACE,)

    def lower(self, ep: Any, target: TargetSpec, options: dict[str, Any]) -> Any:
        """Every ``aten.relu`` becomes ``doublelib::relu`` (the library's kernel)."""
        from executorch.exir.dialects._ops import ops as exir_ops

        for node in ep.graph_module.graph.nodes:
            if node.op == "call_function" and node.target == exir_ops.edge.aten.relu.default:
                node.target = exir_ops.edge.doublelib.relu.default
        ep.graph_module.recompile()
        return ep

    def host_arithmetic(self) -> HostArithmetic:
        return HostArithmetic(kernels={"doublelib::relu": relu_out})

    def dim_order_problem(self, op: str, args: Sequence[KernelArg]) -> str | None:
        """The C kernel walks memory linearly: input and output must share a dim order."""
        if op != "doublelib::relu":
            return None
        orders = {a.order for a in args}
        return None if len(orders) == 1 else f"doublelib's relu needs one dim order, got {sorted(orders)}"


DOUBLELIB_CPU = TargetSpec(
    name="doublelib-cpu",
    description="a CPU with the doublelib kernel library (test plugin)",
    npu=None,
    cpu_fallback=NAMESPACE,
    cpu="cortex-m33",
)


@hookimpl
def etforge_targets() -> list[TargetSpec]:
    return [DOUBLELIB_CPU]


@hookimpl
def etforge_cpu_backends() -> list[CpuBackend]:
    return [DoubleLibBackend()]
