"""Cortex-M33 with CMSIS-NN kernels (``executorch.backends.cortex_m``), and the CPU-only target.

The lowering is ExecuTorch's own: its Cortex-M quantizer for the CPU-bound nodes and its
pass manager, configured for the target's core, rewrite leftovers into ``cortex_m::`` ops.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from etforge.plugins.targets.portable import EXECUTORCH_LIBRARIES
from etforge.sdk import CpuBackend, HostArithmetic, KernelArg, KernelLibrary, OptionSpec, TargetSpec, hookimpl

if TYPE_CHECKING:
    from executorch.exir import EdgeCompileConfig
    from torch.export import ExportedProgram
    from torchao.quantization.pt2e.quantizer import Quantizer

CPU_OPTIONS = (
    OptionSpec(
        "cpu",
        "cortex-m33",
        "Cortex-M core the CMSIS-NN kernels and scratch sizes are chosen for.",
        choices=("cortex-m4", "cortex-m7", "cortex-m33", "cortex-m55", "cortex-m85"),
    ),
    OptionSpec(
        "isa",
        "auto",
        "CMSIS-NN implementation: auto (the core's best), scalar, dsp or mve; validated against the core.",
        choices=("auto", "scalar", "dsp", "mve"),
    ),
)

#: CMSIS-NN kernels (and Neutron) work in NHWC, so on Cortex-M targets every 4-D tensor of
#: the program is channels-last; this option only says what the *user's* tensors are.
DIM_ORDER_OPTION = OptionSpec(
    "dim_order",
    "channels_last",
    "Memory format of the program's 4-D inputs and outputs. channels_last: the caller's "
    "buffers are NHWC and nothing is converted; contiguous: NCHW buffers, converted once "
    "at each 4-D input and output (the program stays channels-last inside).",
    choices=("channels_last", "contiguous"),
)

CORTEX_M33 = TargetSpec(
    name="cortex-m33",
    description="i.MX RT700 CPU only: CMSIS-NN kernels, runs without the eIQ Neutron SDK",
    npu=None,
    cpu_fallback="cortex_m",
    cpu="cortex-m33",
    quant_schemes=(),  # every node is quantized by the Cortex-M rules
    options=(*CPU_OPTIONS, DIM_ORDER_OPTION),
)


def target_config(target: TargetSpec, options: dict[str, Any]) -> Any:
    """ExecuTorch's CortexMTargetConfig for the chosen core and ISA (an invalid pair is an error)."""
    from executorch.backends.cortex_m.library import cmsis_nn
    from executorch.backends.cortex_m.target_config import CortexM, CortexMTargetConfig

    from etforge.sdk import EtforgeError

    cpu_name = str(options.get("cpu") or target.cpu)
    try:
        cpu = CortexM[cpu_name.lower().removeprefix("cortex-").upper()]
    except KeyError:
        raise EtforgeError(f"target {target.name!r}: unknown Cortex-M core {cpu_name!r}") from None
    isa_name = str(options.get("isa", "auto"))
    isa = None if isa_name == "auto" else getattr(cmsis_nn.Backend, isa_name.upper())
    try:
        return CortexMTargetConfig(cpu=cpu, isa=isa)
    except ValueError as exc:
        raise EtforgeError(f"option isa={isa_name} on cpu={cpu_name}: {exc}") from None


#: CMSIS-NN's kernels as ExecuTorch's Cortex-M backend registers them (``cortex_m::`` ops).
CMSIS_NN = KernelLibrary(
    "cortex_m", "CMSIS-NN (cortex_m::)", "backends/cortex_m/ops/operators.yaml", "backends/cortex_m/ops"
)


class CortexMBackend(CpuBackend):
    name = "cortex_m"
    description = "CMSIS-NN kernels via executorch.backends.cortex_m (cortex_m::* ops)"
    placement = "cortex-m"
    channels_last = True
    #: CMSIS-NN's cortex_m:: kernels first, then ExecuTorch's quantized and portable ones.
    kernel_libraries = (CMSIS_NN, *EXECUTORCH_LIBRARIES)
    kernel_namespaces = ("cortex_m",)
    layout_ops = ("cortex_m.transpose",)
    folds_qdq = True
    quantize_ops = ("cortex_m.quantize_per_tensor.default",)
    dequantize_ops = ("cortex_m.dequantize_per_tensor.default",)
    #: Its passes' ``__init__`` imports every pass, and through Arm's the TOSA dialect and
    #: torchao's MX formats: a host run needs only the op library (``_register_cortex_m_ops``).
    host_deferred_inits = ("executorch.backends.cortex_m.passes",)

    def host_arithmetic(self) -> HostArithmetic:
        """CMSIS-NN's arithmetic on the host (``cortex_m_host``: its numpy port, proven bit-exact
        against CMSIS-NN's C in ``tests/test_cortex_m_kernels.py``)."""
        from etforge.plugins.targets import cortex_m_host

        return HostArithmetic(
            kernels=cortex_m_host.KERNELS,
            reference=cortex_m_host.cmsis_reference,
            not_proven=cortex_m_host.NOT_PROVEN,
            register=_register_cortex_m_ops,
            reads=cortex_m_host.READS,
        )

    def dim_order_problem(self, op: str, args: Sequence[KernelArg]) -> str | None:
        """CMSIS-NN's (NHWC) and the portable kernels' dim-order rules (``dim_orders.problem``)."""
        from etforge.plugins.targets.dim_orders import problem

        return problem(op, args)

    def isa(self, target: TargetSpec, options: dict[str, Any]) -> str | None:
        """The CMSIS-NN implementation (scalar, dsp, mve) chosen for the core."""
        return str(target_config(target, options).backend.name).lower()

    def quantizer(self, target: TargetSpec, options: dict[str, Any]) -> Quantizer | None:
        from etforge.plugins.targets import cortex_m_passes

        return cortex_m_passes.quantizer()

    def edge_compile_config(self) -> EdgeCompileConfig | None:
        from executorch.backends.cortex_m.edge_compile_config import cortex_m_edge_compile_config

        return cortex_m_edge_compile_config()

    def lower(self, ep: ExportedProgram, target: TargetSpec, options: dict[str, Any]) -> ExportedProgram:
        import logging

        from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager

        from etforge.plugins.targets.cortex_m_broadcast import channels_last_broadcasts
        from etforge.plugins.targets.cortex_m_passes import transform
        from etforge.plugins.targets.cortex_m_unfused import with_unfused_activations

        logging.getLogger("executorch.exir.pass_manager").setLevel(logging.ERROR)
        config = target_config(target, options)
        try:
            passes = with_unfused_activations(list(CortexMPassManager.legacy_pass_list))
            work = copy_program(ep)
            channels_last_broadcasts(work)
            lowered = transform(work, passes, config)
        except Exception as exc:  # an upstream pass failing on a graph it does not expect
            first = exc
        else:
            return _checked(_aligned(lowered), target)
        # The passes after the q/dq folding re-trace the graph with fake tensors: a folded
        # linear (int8 x int8 + int32 bias) traces to int32, and an int8 op that takes it
        # (bmm) fails to trace. Substituting the CMSIS-NN ops once right after the folding
        # gives every consumer its int8 producer; the usual passes then run as before.
        from executorch.backends.cortex_m.passes.aten_to_cortex_m_pass import AtenToCortexMPass

        from etforge.sdk import record_fallback

        record_fallback(
            "cpu_lowering",
            "re-ran ExecuTorch's Cortex-M passes with the CMSIS-NN substitution right after the q/dq folding",
            "CortexMPassManager",
            # the recovered error by type and where (pass, node); its time is in the report's
            # stages ("lower: cpu_lowering"), not here: fallbacks compare equal across runs
            f"the usual pass order{pass_failure(first, ep)}",
        )

        passes = with_unfused_activations(list(CortexMPassManager.pass_list))
        at = next(i for i, p in enumerate(passes) if p.__name__ == "FoldAndAnnotateQParamsPass") + 1
        passes.insert(at, AtenToCortexMPass)
        try:
            channels_last_broadcasts(ep)
            lowered = transform(ep, passes, config)
        except Exception:
            raise lowering_error(first, ep, target) from None
        return _checked(_aligned(lowered), target)


def _register_cortex_m_ops() -> None:
    """``torch.ops.cortex_m``: ``executorch.backends.cortex_m.passes`` defines the library in the
    order its own modules need (importing ``cortex_m.ops.operators`` first fails on a circular
    import). Where ``etforge verify`` deferred that package's ``__init__`` (``host_deferred_inits``),
    importing it runs nothing and ``operators`` defines the library alone; elsewhere the
    package's ``__init__`` has imported it already."""
    import importlib

    for module in ("executorch.backends.cortex_m.passes", "executorch.backends.cortex_m.ops.operators"):
        importlib.import_module(module)  # in this order


def _checked(ep: ExportedProgram, target: TargetSpec) -> ExportedProgram:
    """``ep``, once no ATen arithmetic op in it reads int8 codes (``cortex_m_int8_codes.py``)."""
    from etforge.plugins.targets.cortex_m_int8_codes import check

    check(ep, target.name)
    return ep


def _aligned(ep: ExportedProgram) -> ExportedProgram:
    """Every portable and CMSIS-NN kernel call given the dim orders its C++ kernel accepts
    (``plugins/targets/dim_orders.py``): the pass manager leaves channels-last tensors where ExecuTorch's
    portable kernels refuse or miscompute them."""
    from etforge.plugins.targets.dim_orders import align, summary
    from etforge.sdk import LOWERING_NOTES_KEY

    ep.graph_module.meta[LOWERING_NOTES_KEY] = summary(align(ep))
    return ep


def copy_program(ep: ExportedProgram) -> ExportedProgram:
    """A copy the pass manager may change in place (a failed attempt must not leak).

    Lowered (delegate) modules are shared, not copied: no pass changes them, and a copy
    would rebuild each delegate's whole original program (and drop the shape stub the
    pipeline gave it for these passes)."""
    import copy

    lowered = {id(m): m for m in ep.graph_module.modules() if hasattr(m, "processed_bytes")}
    return copy.deepcopy(ep, lowered)


def lowering_error(exc: BaseException, ep: ExportedProgram, target: TargetSpec) -> Exception:
    """ExecuTorch's Cortex-M pass manager failed: one line naming the pass, node and op."""
    from etforge.sdk import EtforgeError

    return EtforgeError(
        f"{target.name}: ExecuTorch's Cortex-M lowering{pass_failure(exc, ep)}; this graph pattern has no "
        "CMSIS-NN lowering upstream (compile for a target with the NPU, or change the model around that node)"
    )


def pass_failure(exc: BaseException, ep: ExportedProgram) -> str:
    """ " (pass P) failed at node N (op): Error: first line" from a pass manager's exception chain.

    Its exceptions wrap the pass name around torch.fx's "While executing %node" trace.
    """
    import re

    from etforge.sdk import node_op

    chain, cause = [], exc
    while cause is not None and len(chain) < 8:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    text = "\n".join(str(e) for e in chain)
    pass_name = re.search(r"running the '(\w+)' pass", text)
    where = re.search(r"While executing %(\w+)", text)
    root = chain[-1]
    first = next((ln.strip() for ln in str(root).splitlines() if ln.strip()), type(root).__name__)
    nodes = {n.name: n for n in ep.graph_module.graph.nodes}
    at = ""
    if where:
        node = nodes.get(where.group(1))
        at = f" at node {where.group(1)}" + (f" ({node_op(node)})" if node is not None else "")
    return (
        f"{f' (pass {pass_name.group(1)})' if pass_name else ''} failed{at}: {type(root).__name__}: {first}"
    )


@hookimpl
def etforge_targets() -> list[TargetSpec]:
    return [CORTEX_M33]


@hookimpl
def etforge_cpu_backends() -> list[CpuBackend]:
    return [CortexMBackend()]


@hookimpl
def etforge_rewrites() -> list[Any]:
    from etforge.plugins.targets.cortex_m_batch_norm import BatchNormAsInt8Layer
    from etforge.plugins.targets.cortex_m_conv1d import Conv1dAsConv2d
    from etforge.plugins.targets.cortex_m_prelu import PReluAsInt8Ops

    return [BatchNormAsInt8Layer(), Conv1dAsConv2d(), PReluAsInt8Ops()]
