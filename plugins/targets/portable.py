"""The portable CPU backend: ExecuTorch's portable (and quantized) kernels, no extra lowering."""

from __future__ import annotations

from etforge.sdk import CpuBackend, hookimpl


class Portable(CpuBackend):
    name = "portable"
    description = "ExecuTorch portable kernels (aten::*.out, quantized_decomposed::*.out)"
    placement = "portable"
    #: ExecuTorch's kernel libraries the firmware links (``core.kernel_check``).
    kernel_libraries = ("quantized", "portable", "portable_custom", "et_copy")


@hookimpl
def etforge_cpu_backends() -> list[CpuBackend]:
    return [Portable()]
