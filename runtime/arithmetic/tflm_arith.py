"""A LiteRT partition rewritten so LiteRT's reference kernels compute what TFLite Micro does.

TFLM with CMSIS-NN equals LiteRT's reference kernels (``OpResolverType.BUILTIN_REF``) op for
op but one: int8 FULLY_CONNECTED. LiteRT scales its int32 accumulator by the double multiplier
and rounds once, halves away from zero (``runtime.arithmetic.tflite_int.fc_requantize``); TFLM's kernel
(CMSIS-NN ``arm_fully_connected_s8`` / ``arm_nn_requantize``) uses the Q31 multiplier and
shift with two roundings, as every convolution does. They differ by one step where the
product lies within a rounding of a half (measured: conv -> flip -> conv -> linear for
imxrt700cm, sample 2 of seed 0, output 2: LiteRT -58, TFLM -59, accumulator -12388).

``tflm_model`` turns each int8 FULLY_CONNECTED into RESHAPE -> CONV_2D (1x1, the same weight
bytes, quantization, bias and fused activation) -> RESHAPE, whose reference kernel
requantizes as TFLM's FC does. An FC whose weights carry a zero point (a constant matrix
operand quantized asymmetrically; CONV_2D takes symmetric weights only) keeps LiteRT's FC:
its rounding against TFLM's is not proven, and a difference fails the device check (it is
never hidden). Only the host's check of a device run uses it
(``litert_run`` kernels ``"tflm"``); the program's partitions are never changed.
"""

from __future__ import annotations

import copy
import math
from functools import lru_cache
from typing import Any

import numpy as np


def _opcode(model: Any, schema: Any, builtin: int) -> int:
    for i, oc in enumerate(model.operatorCodes):
        if max(int(oc.builtinCode), int(oc.deprecatedBuiltinCode)) == builtin:
            return i
    oc = schema.OperatorCodeT()
    oc.builtinCode = builtin
    oc.deprecatedBuiltinCode = min(builtin, 127)
    oc.version = 1
    model.operatorCodes.append(oc)
    return len(model.operatorCodes) - 1


def _const_shape(model: Any, graph: Any, schema: Any, shape: list[int], name: str) -> int:
    buf = schema.BufferT()
    buf.data = np.asarray(shape, "<i4").tobytes()
    model.buffers.append(buf)
    t = schema.TensorT()
    t.shape, t.type, t.buffer, t.name = [len(shape)], schema.TensorType.INT32, len(model.buffers) - 1, name
    graph.tensors.append(t)
    return len(graph.tensors) - 1


def _like(graph: Any, src: Any, shape: list[int], name: str, buffer: int = 0) -> int:
    t = copy.deepcopy(src)
    t.shape, t.shapeSignature, t.name, t.buffer = list(shape), None, name.encode(), buffer
    graph.tensors.append(t)
    return len(graph.tensors) - 1


def _op(opcode: int, inputs: list[int], outputs: list[int], opt_type: int = 0, opt: Any = None) -> Any:
    from ai_edge_litert import schema_py_generated as schema

    op = schema.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = opcode, inputs, outputs
    op.builtinOptionsType, op.builtinOptions = opt_type, opt
    return op


def _rewrite_fc(model: Any, graph: Any, schema: Any, op: Any, k: int) -> list[Any] | None:
    """RESHAPE -> CONV_2D 1x1 -> RESHAPE for an int8 FC with constant weights, else None."""
    x, w = graph.tensors[op.inputs[0]], graph.tensors[op.inputs[1]]
    y = graph.tensors[op.outputs[0]]
    int8 = schema.TensorType.INT8
    data = model.buffers[w.buffer].data
    if x.type != int8 or w.type != int8 or y.type != int8 or data is None or len(data) == 0:
        return None
    zero_points = w.quantization.zeroPoint if w.quantization is not None else None
    if zero_points is not None and any(int(z) != 0 for z in zero_points):
        # A constant matrix operand quantized with a zero point (mm/addmm of two activations'
        # kind): CONV_2D takes symmetric weights only, so this FC stays LiteRT's (module doc).
        return None
    o, depth = int(w.shape[0]), int(w.shape[1])
    batch = math.prod(int(d) for d in x.shape) // depth
    base = f"etforge_tflm_fc{k}"
    x4 = _like(graph, x, [batch, 1, 1, depth], f"{base}_in")
    w4 = _like(graph, w, [o, 1, 1, depth], f"{base}_w", w.buffer)
    y4 = _like(graph, y, [batch, 1, 1, o], f"{base}_out")
    conv = schema.Conv2DOptionsT()
    conv.padding, conv.strideW, conv.strideH = schema.Padding.VALID, 1, 1
    conv.fusedActivationFunction = op.builtinOptions.fusedActivationFunction if op.builtinOptions else 0
    reshape = _opcode(model, schema, schema.BuiltinOperator.RESHAPE)
    bias = op.inputs[2] if len(op.inputs) > 2 else -1
    return [
        _op(reshape, [op.inputs[0], _const_shape(model, graph, schema, [batch, 1, 1, depth], f"{base}_s0")], [x4]),
        _op(
            _opcode(model, schema, schema.BuiltinOperator.CONV_2D), [x4, w4, bias], [y4],
            schema.BuiltinOptions.Conv2DOptions, conv,
        ),
        _op(reshape, [y4, _const_shape(model, graph, schema, [int(d) for d in y.shape], f"{base}_s1")], [op.outputs[0]]),
    ]  # fmt: skip


@lru_cache(maxsize=64)
def tflm_model(model: bytes) -> bytes:
    """``model`` with every int8 FULLY_CONNECTED computed as TFLM computes it (module doc);
    ``model`` itself when it has none."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    m = schema.ModelT.InitFromPackedBuf(bytearray(model), 0)
    fc = schema.BuiltinOperator.FULLY_CONNECTED
    changed = 0
    for graph in m.subgraphs:
        ops = []
        for op in graph.operators:
            oc = m.operatorCodes[op.opcodeIndex]
            new = None
            if max(int(oc.builtinCode), int(oc.deprecatedBuiltinCode)) == fc:
                new = _rewrite_fc(m, graph, schema, op, changed)
            if new is None:
                ops.append(op)
            else:
                ops += new
                changed += 1
        graph.operators = ops
    if not changed:
        return model
    b = flatbuffers.Builder(len(model) + 4096)
    b.Finish(m.Pack(b), file_identifier=b"TFL3")
    return bytes(b.Output())
