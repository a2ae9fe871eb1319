"""Conversion entry points of the eIQ Neutron SDK test double (see the package docstring)."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema

from eiq_neutron_sdk import ERROR_MESSAGE, MODE_ENV, MODES, NUM_MACS_ENV, PIDFILE_ENV

KERNEL_SELECTION_FILE = "_kernel_selection.c"  # written to the working directory, as the SDK does
_SCRATCH_BYTES = 4096


class _Strict:
    """Attribute sets like a pybind11 object: assigning an unknown name is an error."""

    __slots__: tuple[str, ...] = ()

    def __init__(self, **values: object) -> None:
        for k in self.__slots__:
            setattr(self, k, values.get(k))


class NpuInfo(_Strict):
    __slots__ = ("subsystem", "numUnits", "numPipes", "numMacs", "hwVersion")


class NeutronTarget(_Strict):
    __slots__ = ("name", "npu")


def _target(name: str, hw_version: int = 2, subsystem: bool = False) -> Callable[[], NeutronTarget]:
    # Placeholder figures of the double (hwVersion 2 is N3, what upstream requires), not NXP data.
    def make() -> NeutronTarget:
        macs = int(os.environ.get(NUM_MACS_ENV, "16"))
        npu = NpuInfo(subsystem=subsystem, numUnits=4, numPipes=4, numMacs=macs, hwVersion=hw_version)
        return NeutronTarget(name=name, npu=npu)

    return make


#: The double's targets: imxrt700; ``double-n3``, a made-up second Neutron-C (N3) chip that
#: lets tests tell which chip a partition was compiled for; ``double-n1`` (hardware version 1)
#: and ``double-s`` (a Neutron-S subsystem), which upstream's target spec refuses.
TARGETS: dict[str, Callable[[], NeutronTarget]] = {
    "imxrt700": _target("imxrt700"),
    "double-n3": _target("double-n3"),
    "double-n1": _target("double-n1", hw_version=1),
    "double-s": _target("double-s", subsystem=True),
}


class CompilationOptions(_Strict):
    __slots__ = (
        "minNumOpsPerGraph",
        "excludeGraphPasses",
        "fetchConstantsToSRAM",
        "dumpKernelSelectionCode",
        "useProfiling",
        "dumpAfterImport",
        "dumpAfterGenerate",
        "verbose",
    )


class CompilationContext(_Strict):
    __slots__ = ("targetOpts", "compilationOpts")

    def __init__(self) -> None:
        super().__init__()
        self.compilationOpts = CompilationOptions(
            minNumOpsPerGraph=1,
            excludeGraphPasses="",
            fetchConstantsToSRAM=False,
            dumpKernelSelectionCode=False,
            useProfiling=False,
            dumpAfterImport="",
            dumpAfterGenerate="",
            verbose=False,
        )


def getNeutronTarget(name: str) -> NeutronTarget:  # noqa: N802  (the SDK's spelling)
    if name not in TARGETS:
        raise ValueError(f"unknown Neutron target {name!r}")
    return TARGETS[name]()


def _mode() -> str:
    mode = os.environ.get(MODE_ENV, "v1")
    if mode not in MODES:
        raise ValueError(f"{MODE_ENV}={mode!r}; expected one of {MODES}")
    return mode


def _opname(model: schema.ModelT, op: schema.OperatorT) -> str:
    code = model.operatorCodes[op.opcodeIndex]
    if code.builtinCode == schema.BuiltinOperator.CUSTOM:
        return code.customCode.decode() if isinstance(code.customCode, bytes) else str(code.customCode)
    names = {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}
    return names.get(code.builtinCode, f"OP_{code.builtinCode}")


def _blob_tensor(
    model: schema.ModelT, graph: schema.SubGraphT, name: str, data: bytes | None, size: int
) -> int:
    tensor = schema.TensorT()
    tensor.name = name.encode()
    tensor.type = schema.TensorType.UINT8
    tensor.shape = [size]
    tensor.buffer = 0
    if data is not None:
        buffer = schema.BufferT()
        buffer.data = np.frombuffer(data, dtype=np.uint8)
        model.buffers.append(buffer)
        tensor.buffer = len(model.buffers) - 1
    graph.tensors.append(tensor)
    return len(graph.tensors) - 1


def _io_tensor(src: schema.TensorT) -> schema.TensorT:
    tensor = schema.TensorT()
    tensor.name, tensor.type, tensor.shape = src.name, src.type, src.shape
    tensor.shapeSignature, tensor.quantization, tensor.buffer = src.shapeSignature, src.quantization, 0
    return tensor


def _convert(data: bytes, cctx: CompilationContext, with_extra_outputs: bool) -> bytes:
    src = schema.ModelT.InitFromPackedBuf(data, 0)
    if len(src.subgraphs) != 1:
        raise RuntimeError(f"NeutronConverter: expected 1 subgraph, got {len(src.subgraphs)}")
    sg = src.subgraphs[0]
    ops = [_opname(src, op) for op in sg.operators]
    io = [int(t) for t in sg.inputs] + [int(t) for t in sg.outputs]
    constants = b"".join(
        bytes(np.asarray(src.buffers[t.buffer].data, dtype=np.uint8))
        for i, t in enumerate(sg.tensors)
        if i not in io and t.buffer and src.buffers[t.buffer].data is not None
    )
    digest = hashlib.sha256(data).digest()
    target = cctx.targetOpts.name
    opts = cctx.compilationOpts
    microcode = (
        f"NEUTRON-DOUBLE microcode for {target} (excludeGraphPasses={opts.excludeGraphPasses!r}, "
        f"fetchConstantsToSRAM={bool(opts.fetchConstantsToSRAM)}): {' '.join(ops)}\0"
    ).encode() + digest
    weights = b"NEUTRON-DOUBLE weights\0" + constants
    kernels = b"NEUTRON-DOUBLE kernels\0" + "\0".join(sorted(set(ops))).encode()

    model = schema.ModelT()
    model.version = 3
    model.description = b"eIQ Neutron SDK test double"
    model.buffers = [schema.BufferT()]  # buffer 0: the empty sentinel
    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.CUSTOM
    code.customCode = b"NeutronGraph"
    code.version = 1
    model.operatorCodes = [code]
    graph = schema.SubGraphT()
    graph.name = b"main"
    graph.tensors = []
    inputs = []
    for t in sg.inputs:
        graph.tensors.append(_io_tensor(sg.tensors[t]))
        inputs.append(len(graph.tensors) - 1)
    outputs = []
    for t in sg.outputs:
        graph.tensors.append(_io_tensor(sg.tensors[t]))
        outputs.append(len(graph.tensors) - 1)
    blobs = [
        _blob_tensor(model, graph, name, blob, len(blob))
        for name, blob in (("microcode", microcode), ("weights", weights), ("kernels", kernels))
    ]
    extra = (
        [_blob_tensor(model, graph, n, None, 256) for n in ("profile", "debug")] if with_extra_outputs else []
    )
    scratch = _blob_tensor(model, graph, "scratch", None, _SCRATCH_BYTES)
    node = schema.OperatorT()
    node.opcodeIndex = 0
    # The node lists the graph's I/O in an order of its own (reversed here); the payload's
    # index maps are what tell the runtime which is which.
    node.inputs = inputs[::-1] + blobs
    node.outputs = outputs[::-1] + extra + [scratch]
    graph.operators = [node]
    graph.inputs, graph.outputs = inputs, outputs
    model.subgraphs = [graph]
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    if cctx.compilationOpts.dumpKernelSelectionCode:
        lines = [f"/* Neutron kernel selection for {target} (eIQ Neutron SDK test double) */"]
        for op in sorted(set(ops)):
            macro = "NEUTRON_KERNEL_" + "".join(c if c.isalnum() else "_" for c in op.upper())
            lines += [f"#ifndef {macro}", f"#define {macro} 1", "#endif"]
        Path(KERNEL_SELECTION_FILE).write_text("\n".join(lines) + "\n")
    print(f"NeutronConverter (test double): {len(ops)} operators -> 1 NeutronGraph on {target}")
    return bytes(builder.Output())


def convertModel(model: list[int], cctx: CompilationContext) -> list[int]:  # noqa: N802
    """The SDK's entry point: a TFLite model in, the model with one NeutronGraph node out."""
    if not isinstance(model, list):  # pybind11's vector<uint8_t> caster refuses bytes
        raise TypeError(f"convertModel(): incompatible function arguments: model is {type(model).__name__}")
    if not isinstance(cctx, CompilationContext) or not isinstance(cctx.targetOpts, NeutronTarget):
        raise TypeError("convertModel(): cctx must be a CompilationContext with targetOpts set")
    mode = _mode()
    if mode == "raise":
        raise RuntimeError(ERROR_MESSAGE)
    if mode == "abort":
        os.abort()
    if mode == "hang":
        if os.environ.get(PIDFILE_ENV):  # lets a test check that the timeout killed it
            Path(os.environ[PIDFILE_ENV]).write_text(str(os.getpid()))
        while True:
            time.sleep(3600)
    return list(_convert(bytes(model), cctx, with_extra_outputs=mode == "v1"))
