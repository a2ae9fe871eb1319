"""The portable CPU backend: ExecuTorch's portable (and quantized) kernels, no extra lowering."""

from __future__ import annotations

from collections.abc import Sequence

from etforge.sdk import CpuBackend, KernelArg, KernelLibrary, hookimpl

#: ExecuTorch's own kernel libraries, in lookup order (every CPU backend here links them).
EXECUTORCH_LIBRARIES: tuple[KernelLibrary, ...] = (
    KernelLibrary(
        "quantized", "ExecuTorch quantized", "kernels/quantized/quantized.yaml", "kernels/quantized/cpu"
    ),
    KernelLibrary(
        "portable", "ExecuTorch portable", "kernels/portable/functions.yaml", "kernels/portable/cpu"
    ),
    KernelLibrary("portable_custom", "ExecuTorch portable custom", "kernels/portable/custom_ops.yaml"),
    KernelLibrary("et_copy", "ExecuTorch copy/dim-order", "kernels/portable/et_copy_ops.yaml"),
)


class Portable(CpuBackend):
    name = "portable"
    description = "ExecuTorch portable kernels (aten::*.out, quantized_decomposed::*.out)"
    placement = "portable"
    kernel_libraries = EXECUTORCH_LIBRARIES

    def dim_order_problem(self, op: str, args: Sequence[KernelArg]) -> str | None:
        """The portable kernels' dim-order rules (``dim_orders.portable_problem``)."""
        from etforge.plugins.targets.dim_orders import portable_problem

        return portable_problem(op, args)


@hookimpl
def etforge_cpu_backends() -> list[CpuBackend]:
    return [Portable()]
