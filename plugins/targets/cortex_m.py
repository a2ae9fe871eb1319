"""Cortex-M33 with CMSIS-NN kernels (``executorch.backends.cortex_m``), and the CPU-only target.

The lowering is ExecuTorch's own: its Cortex-M quantizer for the CPU-bound nodes and its
pass manager, configured for the target's core, rewrite leftovers into ``cortex_m::`` ops.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from etforge.core.cpu_backend import CpuBackend
from etforge.core.hookspecs import hookimpl
from etforge.core.target import OptionSpec, TargetSpec

if TYPE_CHECKING:
    from executorch.exir import EdgeCompileConfig
    from torch.export import ExportedProgram
    from torchao.quantization.pt2e.quantizer import Quantizer

CORTEX_M33 = TargetSpec(
    name="cortex-m33",
    description="i.MX RT700 CPU only: CMSIS-NN kernels, runs without the eIQ Neutron SDK",
    npu=None,
    cpu_fallback="cortex_m",
    cpu="cortex-m33",
    quant_schemes=(),  # every node is quantized by the Cortex-M rules
    options=(
        OptionSpec(
            "dim_order",
            "channels_last",
            "Memory format of the program's 4-D inputs; CMSIS-NN convolutions need channels_last.",
            choices=("channels_last", "contiguous"),
        ),
    ),
)


def _cpu(target: TargetSpec) -> Any:
    from executorch.backends.cortex_m.target_config import CortexM

    name = target.cpu.lower().removeprefix("cortex-").upper().replace("+", "PLUS")
    try:
        return CortexM[name]
    except KeyError:
        raise ValueError(f"target {target.name!r}: unknown Cortex-M core {target.cpu!r}") from None


class CortexMBackend(CpuBackend):
    name = "cortex_m"
    description = "CMSIS-NN kernels via executorch.backends.cortex_m (cortex_m::* ops)"
    placement = "cortex-m"

    def quantizer(self, target: TargetSpec, options: dict[str, Any]) -> Quantizer | None:
        from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer

        return CortexMQuantizer()

    def edge_compile_config(self) -> EdgeCompileConfig | None:
        from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config

        return cortex_m_edge_compile_config()

    def lower(self, ep: ExportedProgram, target: TargetSpec, options: dict[str, Any]) -> ExportedProgram:
        import logging

        from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager
        from executorch.backends.cortex_m.target_config import CortexMTargetConfig

        logging.getLogger("executorch.exir.pass_manager").setLevel(logging.ERROR)
        config = CortexMTargetConfig(cpu=_cpu(target))
        return CortexMPassManager(ep, target_config=config).transform()


@hookimpl
def etforge_targets() -> list[TargetSpec]:
    return [CORTEX_M33]


@hookimpl
def etforge_cpu_backends() -> list[CpuBackend]:
    return [CortexMBackend()]
