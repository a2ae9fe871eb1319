"""A LiteRT (TFLite) flatbuffer builder on the schema's generated object API.

``ai_edge_litert.schema_py_generated`` is flatc output of the same schema the interpreter
reads, so nothing here restates the schema. Constant buffers are deduplicated by content.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import flatbuffers
import numpy as np
from ai_edge_litert import schema_py_generated as schema

_DTYPES = {
    "float32": (schema.TensorType.FLOAT32, np.float32),
    "int8": (schema.TensorType.INT8, np.int8),
    "uint8": (schema.TensorType.UINT8, np.uint8),
    "int16": (schema.TensorType.INT16, np.int16),
    "int32": (schema.TensorType.INT32, np.int32),
    "int64": (schema.TensorType.INT64, np.int64),
    "bool": (schema.TensorType.BOOL, np.bool_),
}
_PLACEHOLDER_FOR_GREATER_OP_CODES = 127
_BUFFER_ALIGN = 16  # schema.fbs: Buffer.data (force_align: 16); the Python object API ignores it


class _AlignedBufferT(schema.BufferT):
    """A Buffer whose data vector is 16-byte aligned, as the schema asks and kernels expect."""

    def Pack(self, builder: flatbuffers.Builder) -> int:  # noqa: N802 (flatc's name)
        data = None
        if self.data is not None:
            raw = np.asarray(self.data, dtype=np.uint8).tobytes()
            builder.StartVector(1, len(raw), _BUFFER_ALIGN)
            builder.head = builder.head - len(raw)
            builder.Bytes[builder.head : builder.head + len(raw)] = raw
            data = builder.EndVector()
        schema.BufferStart(builder)
        if data is not None:
            schema.BufferAddData(builder, data)
        return schema.BufferEnd(builder)


@dataclass(frozen=True)
class Quant:
    """Affine quantization: per-tensor (one scale) or per-channel along ``axis``."""

    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    axis: int = 0

    @classmethod
    def per_tensor(cls, scale: float, zero_point: int) -> Quant:
        return cls((float(scale),), (int(zero_point),))

    @property
    def per_channel(self) -> bool:
        return len(self.scale) > 1


class LiteRTBuilder:
    """Accumulates one subgraph's tensors and operators, then packs a model."""

    def __init__(self, description: str = "etforge") -> None:
        self.description = description
        self.buffers: list[Any] = [schema.BufferT()]  # buffer 0: the schema's empty sentinel
        self._buffer_of: dict[bytes, int] = {}
        self.tensors: list[Any] = []
        self.operators: list[Any] = []
        self.opcodes: list[Any] = []
        self._opcode_of: dict[tuple[int, str], int] = {}
        self.inputs: list[int] = []
        self.outputs: list[int] = []
        self.metadata: dict[str, bytes] = {}
        self.op_names: list[str] = []

    # -- tensors -------------------------------------------------------------------------------
    def add_tensor(
        self,
        shape: tuple[int, ...] | list[int],
        dtype: str,
        name: str,
        data: np.ndarray | None = None,
        quant: Quant | None = None,
    ) -> int:
        if dtype not in _DTYPES:
            raise ValueError(f"LiteRT builder: unsupported tensor dtype {dtype!r}")
        t = schema.TensorT()
        t.shape = [int(d) for d in shape]
        t.type = _DTYPES[dtype][0]
        t.name = name
        t.buffer = 0
        if data is not None:
            arr = np.asarray(data, dtype=_DTYPES[dtype][1], order="C")
            if tuple(arr.shape) != tuple(t.shape):
                raise ValueError(
                    f"LiteRT builder: tensor {name!r} shape {t.shape} != data shape {list(arr.shape)}"
                )
            t.buffer = self._buffer(arr.tobytes())
        if quant is not None:
            q = schema.QuantizationParametersT()
            q.scale = [float(s) for s in quant.scale]
            q.zeroPoint = [int(z) for z in quant.zero_point]
            q.quantizedDimension = int(quant.axis)
            t.quantization = q
        self.tensors.append(t)
        return len(self.tensors) - 1

    def _buffer(self, raw: bytes) -> int:
        index = self._buffer_of.get(raw)
        if index is None:
            b = _AlignedBufferT()
            b.data = np.frombuffer(raw, dtype=np.uint8)
            self.buffers.append(b)
            index = self._buffer_of[raw] = len(self.buffers) - 1
        return index

    def tensor_shape(self, index: int) -> tuple[int, ...]:
        return tuple(self.tensors[index].shape)

    def tensor_quant(self, index: int) -> Quant | None:
        q = self.tensors[index].quantization
        if q is None or q.scale is None:
            return None
        return Quant(
            tuple(float(s) for s in q.scale), tuple(int(z) for z in q.zeroPoint), int(q.quantizedDimension)
        )

    # -- operators -----------------------------------------------------------------------------
    def _opcode(self, builtin: str, custom: str = "") -> int:
        code = getattr(schema.BuiltinOperator, builtin, None)
        if code is None:
            raise ValueError(f"LiteRT builder: unknown builtin operator {builtin!r}")
        key = (code, custom)
        if key not in self._opcode_of:
            oc = schema.OperatorCodeT()
            oc.builtinCode = code
            oc.deprecatedBuiltinCode = min(code, _PLACEHOLDER_FOR_GREATER_OP_CODES)
            oc.version = 1
            if custom:
                oc.customCode = custom
            self.opcodes.append(oc)
            self._opcode_of[key] = len(self.opcodes) - 1
        return self._opcode_of[key]

    def add_operator(
        self,
        builtin: str,
        inputs: list[int],
        outputs: list[int],
        options: Any = None,
        name: str = "",
        custom: str = "",
        custom_options: bytes | None = None,
    ) -> int:
        """Append an operator. ``options`` is the schema's ``*OptionsT`` object (see :func:`options`)."""
        op = schema.OperatorT()
        op.opcodeIndex = self._opcode(builtin, custom)
        op.inputs = list(inputs)
        op.outputs = list(outputs)
        if options is not None:
            op.builtinOptionsType = getattr(schema.BuiltinOptions, type(options).__name__[:-1])
            op.builtinOptions = options
        if custom_options is not None:
            op.customOptions = list(custom_options)
        self.operators.append(op)
        self.op_names.append(name)
        return len(self.operators) - 1

    # -- model ---------------------------------------------------------------------------------
    def finish(self, debug_map: dict[int, list[int]] | None = None) -> bytes:
        """Pack the model; ``debug_map`` (op index -> Edge debug handles) goes into metadata."""
        sg = schema.SubGraphT()
        sg.tensors = self.tensors
        sg.operators = self.operators
        sg.inputs = list(self.inputs)
        sg.outputs = list(self.outputs)
        sg.name = "main"
        model = schema.ModelT()
        model.version = 3
        model.description = self.description
        model.operatorCodes = self.opcodes
        model.subgraphs = [sg]
        model.buffers = list(self.buffers)
        meta = dict(self.metadata)
        meta["etforge_op_names"] = json.dumps(self.op_names).encode()
        if debug_map is not None:
            meta["etforge_debug_handles"] = json.dumps(
                {str(k): v for k, v in sorted(debug_map.items())}
            ).encode()
        model.metadata = []
        for key in sorted(meta):
            m = schema.MetadataT()
            m.name = key
            m.buffer = len(model.buffers)
            b = schema.BufferT()
            b.data = np.frombuffer(meta[key], dtype=np.uint8)
            model.buffers.append(b)
            model.metadata.append(m)
        fb = flatbuffers.Builder(1024)
        fb.Finish(model.Pack(fb), file_identifier=b"TFL3")
        return bytes(fb.Output())


def options(kind: str, **fields: Any) -> Any:
    """Build a schema options object, e.g. ``options("Conv2DOptions", strideW=1, ...)``.

    Unknown field names are errors rather than silently ignored attributes.
    """
    cls = getattr(schema, kind + "T", None)
    if cls is None:
        raise ValueError(f"LiteRT schema has no options table {kind!r}")
    obj = cls()
    for key, value in fields.items():
        if not hasattr(obj, key):
            raise ValueError(f"{kind} has no field {key!r}")
        setattr(obj, key, value)
    return obj


def enum(kind: str, name: str) -> int:
    """A schema enum value by name, e.g. ``enum("Padding", "VALID")``."""
    return int(getattr(getattr(schema, kind), name))


def read_metadata(model_bytes: bytes) -> dict[str, bytes]:
    """The metadata entries of a LiteRT model (independent of the builder's state).

    Read through the flatbuffer's tables: only the metadata and their buffers are touched
    (the object API unpacks every weight buffer into Python lists: ~14 ms for MobileNetV2's
    2.7 MB partition, and ``verify`` reads each partition's entries once per sample)."""
    model = schema.Model.GetRootAs(model_bytes, 0)
    out: dict[str, bytes] = {}
    for i in range(model.MetadataLength()):
        entry = model.Metadata(i)
        index = entry.Buffer()
        buffer = model.Buffers(index) if index < model.BuffersLength() else None
        if buffer is None or buffer.DataIsNone():  # not an inline byte vector: as the object API reads it
            return _read_metadata_unpacked(model_bytes)
        name = entry.Name()
        out[name.decode() if isinstance(name, bytes) else name] = buffer.DataAsNumpy().tobytes()
    return out


def _read_metadata_unpacked(model_bytes: bytes) -> dict[str, bytes]:
    model = schema.ModelT.InitFromPackedBuf(model_bytes, 0)
    out = {}
    for m in model.metadata or []:
        name = m.name.decode() if isinstance(m.name, bytes) else m.name
        out[name] = bytes(np.asarray(model.buffers[m.buffer].data, dtype=np.uint8))
    return out


#: The kernels a partition must load with: LiteRT's builtin kernels alone (their checks name
#: the failing op), the default set (XNNPACK) and the reference kernels ``verify`` runs.
LOAD_CHECKS = ("BUILTIN_WITHOUT_DEFAULT_DELEGATES", "AUTO", "BUILTIN_REF")


def refusal(model_bytes: bytes) -> tuple[str, str] | None:
    """(kernels, LiteRT's message) when LiteRT cannot load and allocate ``model_bytes``; else None."""
    import warnings

    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    from etforge.core.common.quiet import native_stderr

    for kernels in LOAD_CHECKS:
        try:
            with warnings.catch_warnings(), native_stderr():
                warnings.simplefilter("ignore", UserWarning)
                it = Interpreter(
                    model_content=model_bytes, experimental_op_resolver_type=getattr(OpResolverType, kernels)
                )
                it.allocate_tensors()
            del it
        except (RuntimeError, ValueError) as exc:
            return kernels, " ".join(str(exc).split())
    return None


#: LiteRT builtins that move or select data: their output has their first input's element
#: type. LiteRT checks this for some (STRIDED_SLICE) at prepare, not for all (RESHAPE), and
#: XNNPACK then reads and writes the wrong number of bytes at invoke.
DATA_MOVEMENT = frozenset(
    {
        "RESHAPE",
        "STRIDED_SLICE",
        "SLICE",
        "TRANSPOSE",
        "CONCATENATION",
        "PAD",
        "PADV2",
        "MIRROR_PAD",
        "SQUEEZE",
        "EXPAND_DIMS",
        "GATHER",
        "SPLIT",
        "BROADCAST_TO",
    }
)


def type_change(model_bytes: bytes, operators: list[str]) -> tuple[int, str, str] | None:
    """(op index, input type, output type) of the first data-movement op whose output's element
    type is not its input's; None when there is none."""
    from ai_edge_litert import schema_py_generated as schema

    names = {v: k for k, v in vars(schema.TensorType).items() if not k.startswith("_")}
    graph = schema.Model.GetRootAsModel(model_bytes, 0).Subgraphs(0)
    for index, builtin in enumerate(operators):
        if builtin not in DATA_MOVEMENT or index >= graph.OperatorsLength():
            continue
        op = graph.Operators(index)
        if op.InputsLength() == 0 or op.Inputs(0) < 0:
            continue
        src = graph.Tensors(op.Inputs(0)).Type()
        for j in range(op.OutputsLength()):
            dst = graph.Tensors(op.Outputs(j)).Type()
            if dst != src:
                return index, names.get(src, str(src)), names.get(dst, str(dst))
    return None


def check_loads(name: str, model_bytes: bytes, operators: list[str], op_nodes: dict[int, list[str]]) -> None:
    """A partition LiteRT refuses is a compile error naming its op and node, never an artifact."""
    import re

    from etforge.core.common.errors import EtforgeError

    changed = type_change(model_bytes, operators)
    if changed is not None:
        index, src, dst = changed
        nodes = ", ".join(op_nodes.get(index, [])) or "?"
        raise EtforgeError(
            f"NPU partition {name}: its op {index} ({operators[index]}, from node {nodes}) turns "
            f"{src} into {dst}, which a data-movement op cannot; nothing written (a converter "
            "plugin produced a model LiteRT would run out of bounds)"
        )
    refused = refusal(model_bytes)
    if refused is None:
        return
    kernels, message = refused
    where = ""
    found = re.search(r"Node number (\d+) \((\w+)\) failed to (?:prepare|invoke)", message)
    if found and int(found.group(1)) < len(operators):
        index = int(found.group(1))
        nodes = ", ".join(op_nodes.get(index, [])) or "?"
        where = f" its op {index} ({operators[index]}, from node {nodes})"
    raise EtforgeError(
        f"NPU partition {name}: LiteRT refuses{where} ({kernels} kernels): {message[:400]}; "
        "nothing written (a converter plugin produced a model LiteRT cannot run)"
    )
