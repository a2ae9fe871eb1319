"""The eIQ Neutron SDK as the NPU compiler of the Neutron-C targets.

The SDK (``eiq_neutron_sdk``, proprietary) converts a LiteRT model into one whose single
``NeutronGraph`` custom op carries microcode, weights and kernels. It runs in a child
process; its artifacts are packed in the layout ExecuTorch's ``NeutronBackend`` runtime
reads: a header (I/O counts, per-tensor format flags, I/O index maps, payload version),
then microcode, weights and kernels, each padded to 16 bytes. Without the SDK there is no
device payload, and etforge says so instead of inventing one.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from etforge.core.hookspecs import hookimpl
from etforge.core.npu_compiler import NpuCompiler, NpuPayload
from etforge.core.target import TargetSpec

SDK_MODULE = "eiq_neutron_sdk"
FORMAT_NEUTRON = "neutron-c-v1"
_ALIGN = 16


def convert_in_child(
    model: bytes, target: str, fetch_constants_to_sram: bool, dump_kernel_selection: bool
) -> bytes:
    """Runs in the isolated child: the SDK's own conversion entry point."""
    from eiq_neutron_sdk import neutron_converter, neutron_library_utils  # type: ignore[import-not-found]

    if not neutron_library_utils.isNeutronTarget(target):
        names = [t.name for t in neutron_library_utils.getNeutronTargets()]
        raise SystemExit(f"eIQ Neutron SDK does not know target {target!r} (known: {names})")
    cctx = neutron_converter.CompilationContext()
    cctx.targetOpts = neutron_converter.getNeutronTarget(target)
    cctx.compilationOpts.minNumOpsPerGraph = 1
    cctx.compilationOpts.fetchConstantsToSRAM = fetch_constants_to_sram
    cctx.compilationOpts.dumpKernelSelectionCode = dump_kernel_selection
    return bytes(neutron_converter.convertModel(list(model), cctx))


def _pad(raw: bytes) -> bytes:
    return raw + b"\0" * ((-len(raw)) % _ALIGN)


def pack_neutron_payload(converted: bytes) -> bytes:
    """Extract the NeutronGraph artifacts from the SDK's output model and pack them."""
    import numpy as np
    from ai_edge_litert import schema_py_generated as schema

    model = schema.ModelT.InitFromPackedBuf(converted, 0)
    if len(model.subgraphs) != 1:
        raise ValueError(f"SDK output has {len(model.subgraphs)} subgraphs, expected 1")
    graph = model.subgraphs[0]
    nodes = [
        op
        for op in graph.operators
        if model.operatorCodes[op.opcodeIndex].builtinCode == schema.BuiltinOperator.CUSTOM
        and model.operatorCodes[op.opcodeIndex].customCode in (b"NeutronGraph", "NeutronGraph")
    ]
    if len(graph.operators) != 1 or len(nodes) != 1:
        raise ValueError(f"SDK output has {len(graph.operators)} operators; expected one NeutronGraph node")
    node = nodes[0]

    def blob(tensor: int) -> bytes:
        return bytes(np.asarray(model.buffers[graph.tensors[tensor].buffer].data, dtype=np.uint8))

    microcode, weights, kernels = (blob(t) for t in list(node.inputs)[-3:])
    inputs = [list(graph.inputs).index(t) for t in list(node.inputs)[:-3]]
    outputs = [list(graph.outputs).index(t) for t in list(node.outputs) if t in list(graph.outputs)]
    # etforge partitions take and return each tensor in the bytes order its ExecuTorch dim
    # order gives (NHWC beside channels-last Cortex-M code; any conversion the model's own
    # NCHW I/O needs is a TRANSPOSE inside the graph), so the runtime copies buffers as they
    # are: every I/O format flag is 0 (FORMATLESS).
    header = bytes(
        [len(inputs), len(outputs), len(inputs)] + [0] * (len(inputs) + len(outputs)) + inputs + outputs + [1]
    )
    return _pad(header) + _pad(microcode) + _pad(weights) + _pad(kernels)


class EiqNeutronSdk(NpuCompiler):
    name = "eiq-neutron-sdk"
    family = "neutron-c"

    def available(self) -> tuple[bool, str]:
        if importlib.util.find_spec(SDK_MODULE) is None:
            return False, (
                "eIQ Neutron SDK not installed: NPU partitions are host-only LiteRT models "
                "(no Neutron microcode); install the proprietary eiq_neutron_sdk to build for the device"
            )
        return True, "eIQ Neutron SDK installed"

    def compile(
        self, tflite: bytes, target: TargetSpec, options: dict[str, Any], partition: str
    ) -> NpuPayload:
        from etforge.core.isolated import run_isolated

        converted, log, files = run_isolated(
            f"{__name__}:convert_in_child",
            tflite,
            f"eIQ Neutron SDK on partition {partition}",
            target=options.get("neutron_target", "imxrt700"),
            fetch_constants_to_sram=bool(options.get("fetch_constants_to_sram", False)),
            dump_kernel_selection=True,
        )
        selection = files.get("_kernel_selection.c")
        return NpuPayload(
            format=FORMAT_NEUTRON,
            data=pack_neutron_payload(converted),
            host_only=False,
            kernel_selection=selection.decode() if selection else None,
            log=log,
            runtime_backend_id="NeutronBackend",
        )


@hookimpl
def etforge_npu_compilers() -> list[NpuCompiler]:
    return [EiqNeutronSdk()]
