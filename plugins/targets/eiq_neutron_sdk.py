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

from etforge.sdk import NpuCompiler, NpuPayload, PartitionIo, TargetSpec, hookimpl

SDK_MODULE = "eiq_neutron_sdk"
FORMAT_NEUTRON = "neutron-c-v1"
_ALIGN = 16
#: Seconds one partition may take in the SDK (``--option npu_timeout=SECONDS``).
DEFAULT_TIMEOUT = 3600
#: SDK graph passes left out, as ExecuTorch's NXP backend always asks
#: (``neutron_converter_manager.py``): they move slices and transposes in ways its
#: partitions (and ours, built the same way) do not expect.
EXCLUDED_GRAPH_PASSES = "HoistSliceAboveTranspose,MergeTranspose"


def convert_in_child(
    model: bytes,
    target: str,
    fetch_constants_to_sram: bool,
    dump_kernel_selection: bool,
    exclude_graph_passes: str = EXCLUDED_GRAPH_PASSES,
) -> bytes:
    """Runs in the isolated child: the SDK's own conversion entry point."""
    from eiq_neutron_sdk import neutron_converter, neutron_library_utils  # type: ignore[import-not-found]

    if not neutron_library_utils.isNeutronTarget(target):
        names = [t.name for t in neutron_library_utils.getNeutronTargets()]
        raise SystemExit(f"eIQ Neutron SDK does not know target {target!r} (known: {names})")
    cctx = neutron_converter.CompilationContext()
    cctx.targetOpts = neutron_converter.getNeutronTarget(target)
    cctx.compilationOpts.minNumOpsPerGraph = 1
    cctx.compilationOpts.excludeGraphPasses = exclude_graph_passes
    cctx.compilationOpts.fetchConstantsToSRAM = fetch_constants_to_sram
    cctx.compilationOpts.dumpKernelSelectionCode = dump_kernel_selection
    return bytes(neutron_converter.convertModel(list(model), cctx))


def _pad(raw: bytes) -> bytes:
    return raw + b"\0" * ((-len(raw)) % _ALIGN)


def _sdk_output_error(why: str) -> ValueError:
    return ValueError(f"SDK output is not a single-NeutronGraph model: {why}")


def channels_last_names(tflite: bytes, io: PartitionIo) -> set[str]:
    """Names of the partition's graph I/O tensors held channels-last (a 4-D or 5-D tensor in
    dim order N, spatial..., C): the runtime's CHANNELS_LAST format flag, which tells it the
    NPU tensor is NHWC (used as is when the ExecuTorch tensor is channels-last, transposed
    when it arrives contiguous)."""
    from ai_edge_litert import schema_py_generated as schema

    graph = schema.ModelT.InitFromPackedBuf(tflite, 0).subgraphs[0]
    out: set[str] = set()
    for indices, orders in ((graph.inputs, io.input_dim_orders), (graph.outputs, io.output_dim_orders)):
        for t, order in zip(indices, orders, strict=False):
            rank = len(order)
            if rank in (4, 5) and tuple(order) == (0, *range(2, rank), 1):
                name = graph.tensors[t].name
                out.add(name.decode() if isinstance(name, bytes) else str(name))
    return out


def pack_neutron_payload(converted: bytes, channels_last: set[str] | frozenset[str] = frozenset()) -> bytes:
    """Extract the NeutronGraph artifacts from the SDK's output model and pack them.

    The NeutronGraph node takes the graph inputs, then microcode, weights and kernels; it
    returns the graph outputs, then (newer SDKs) a profile and a debug buffer, then the
    scratch buffer. The payload version tells the runtime which of the two it is: 1 when
    the profile and debug outputs are there, 0 otherwise -- derived from the node, since
    the runtime's reading of the outputs depends on it.
    """
    import numpy as np
    from ai_edge_litert import schema_py_generated as schema

    try:
        model = schema.ModelT.InitFromPackedBuf(converted, 0)
    except Exception as exc:
        raise _sdk_output_error(f"not a TFLite flatbuffer ({type(exc).__name__}: {exc})") from None
    if len(model.subgraphs or []) != 1:
        raise _sdk_output_error(f"{len(model.subgraphs or [])} subgraphs, expected 1")
    graph = model.subgraphs[0]
    ops = list(graph.operators or [])
    codes = list(model.operatorCodes or [])
    if len(ops) != 1:
        raise _sdk_output_error(f"{len(ops)} operators, expected one NeutronGraph node")
    node = ops[0]
    code = codes[node.opcodeIndex] if node.opcodeIndex < len(codes) else None
    if (
        code is None
        or code.builtinCode != schema.BuiltinOperator.CUSTOM
        or code.customCode not in (b"NeutronGraph", "NeutronGraph")
    ):
        raise _sdk_output_error("its operator is not the NeutronGraph custom op")
    node_inputs = [int(t) for t in node.inputs]
    node_outputs = [int(t) for t in node.outputs]
    graph_inputs = [int(t) for t in graph.inputs]
    graph_outputs = [int(t) for t in graph.outputs]
    if len(node_inputs) < 3:
        raise _sdk_output_error(
            f"the node has {len(node_inputs)} inputs; microcode, weights, kernels missing"
        )
    if len(node_outputs) < 2:
        raise _sdk_output_error(f"the node has {len(node_outputs)} outputs; the scratch buffer is missing")

    def blob(tensor: int) -> bytes:
        data = model.buffers[graph.tensors[tensor].buffer].data
        return b"" if data is None else bytes(np.asarray(data, dtype=np.uint8))

    microcode, weights, kernels = (blob(t) for t in node_inputs[-3:])
    results = node_outputs[:-1]  # the last output is the scratch buffer
    version = 0
    if len(results) - 2 == len(graph_outputs):  # profile and debug outputs before it
        version, results = 1, results[:-2]
    if any(t not in graph_inputs for t in node_inputs[:-3]) or any(t not in graph_outputs for t in results):
        raise _sdk_output_error("the node's I/O tensors are not the graph's I/O")
    inputs = [graph_inputs.index(t) for t in node_inputs[:-3]]
    outputs = [graph_outputs.index(t) for t in results]
    if max(len(inputs), len(outputs), len(graph_inputs)) > 255:
        raise _sdk_output_error("more than 255 inputs or outputs (the header counts them in one byte)")

    # etforge partitions take and return each tensor in the bytes order its ExecuTorch dim
    # order gives (NHWC beside channels-last Cortex-M code; any conversion the model's own
    # NCHW I/O needs is a TRANSPOSE inside the graph). A tensor named in ``channels_last`` is
    # flagged 1 (CHANNELS_LAST: the runtime uses a channels-last buffer as it is), the rest 0
    # (FORMATLESS: copied as is). The third count is the delegate's arguments: the
    # partition's inputs, which the SDK keeps as the graph's inputs.
    def flag(tensor: int) -> int:
        name = graph.tensors[tensor].name
        return int((name.decode() if isinstance(name, bytes) else str(name)) in channels_last)

    header = bytes(
        [len(inputs), len(outputs), len(graph_inputs)]
        + [flag(t) for t in node_inputs[:-3]]
        + [flag(t) for t in results]
        + inputs
        + outputs
        + [version]
    )
    return _pad(header) + _pad(microcode) + _pad(weights) + _pad(kernels)


class EiqNeutronSdk(NpuCompiler):
    name = "eiq-neutron-sdk"
    family = "neutron-c"
    memory_note = "the device figure comes from the NPU compiler when the eIQ Neutron SDK is installed"

    def available(self) -> tuple[bool, str]:
        if importlib.util.find_spec(SDK_MODULE) is None:
            return False, (
                "eIQ Neutron SDK not installed: NPU partitions are host-only LiteRT models "
                "(no Neutron microcode); install the proprietary eiq_neutron_sdk to build for the device"
            )
        return True, "eIQ Neutron SDK installed"

    def target_problem(self, target: TargetSpec) -> str:
        """Upstream's refusals when its target spec is made: a Neutron-S subsystem or a hardware
        version the converters do not target (read from the SDK; "" without it)."""
        from etforge.plugins.targets.neutron_spec_sdk import device_problem

        return device_problem(target.npu) if target.npu is not None and target.npu.device else ""

    def compile(
        self, tflite: bytes, target: TargetSpec, options: dict[str, Any], partition: str
    ) -> NpuPayload:
        return self.compile_io(tflite, target, options, partition, PartitionIo())

    def compile_io(
        self, tflite: bytes, target: TargetSpec, options: dict[str, Any], partition: str, io: PartitionIo
    ) -> NpuPayload:
        from etforge.plugins.targets.neutron_spec_sdk import device_problem
        from etforge.sdk import EtforgeError, run_isolated

        npu = target.npu
        if npu is None or not npu.device:
            raise EtforgeError(
                f"target {target.name!r}: its NPU spec names no device (npu.device), so the "
                "eIQ Neutron SDK does not know which Neutron chip to compile for"
            )
        problem = device_problem(npu)
        if problem:
            raise EtforgeError(f"target {target.name!r}: {problem}")
        timeout = float(options.get("npu_timeout") or DEFAULT_TIMEOUT)
        converted, log, files = run_isolated(
            f"{__name__}:convert_in_child",
            tflite,
            f"eIQ Neutron SDK on partition {partition}",
            timeout=timeout,
            timeout_hint="raise the limit with --option npu_timeout=SECONDS",
            target=npu.device,
            fetch_constants_to_sram=bool(options.get("fetch_constants_to_sram", False)),
            dump_kernel_selection=True,
        )
        selection = files.get("_kernel_selection.c")
        return NpuPayload(
            format=FORMAT_NEUTRON,
            data=pack_neutron_payload(converted, channels_last_names(tflite, io)),
            host_only=False,
            kernel_selection=selection.decode() if selection else None,
            log=log,
            runtime_backend_id="NeutronBackend",
        )


@hookimpl
def etforge_npu_compilers() -> list[NpuCompiler]:
    return [EiqNeutronSdk()]
