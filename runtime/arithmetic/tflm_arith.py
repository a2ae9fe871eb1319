"""A LiteRT partition rewritten so LiteRT's reference kernels compute what TFLite Micro does.

TFLM with CMSIS-NN equals LiteRT's reference kernels (``OpResolverType.BUILTIN_REF``) op for
op but two: int8 MUL (its multiplier in double, not float32: ``run``, below) and int8
FULLY_CONNECTED. LiteRT scales its int32 accumulator by the double multiplier
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
from dataclasses import dataclass
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


# int8 MUL. LiteRT's Prepare computes the real multiplier from the float32 scales in float32
# (``tflite_int.mul_multiplier``); TFLM's (``micro/kernels/mul_common.cc``) in double, so the
# two Q31 multipliers differ in their low bits and a product near a rounding boundary lands
# one step apart (measured: a * b for imxrt700cm, 14 of the 65,536 int8 pairs of one set of
# scales; tests/test_firmware_npu.py). No LiteRT op multiplies two activations with a double
# multiplier, so ``run`` cuts the partition at each int8 MUL: LiteRT's reference kernels run
# the ops between them, and each MUL is computed here as TFLM computes it.


@dataclass(frozen=True)
class _Mul:
    a: int
    b: int
    out: int
    qa: tuple[float, int]
    qb: tuple[float, int]
    qo: tuple[float, int]
    low: int
    high: int
    #: Constant operands (tensor id -> int8 array from the flatbuffer's buffer).
    constants: tuple[tuple[int, np.ndarray], ...] = ()

    def __call__(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """TFLM's int8 MUL (``reference_integer_ops::Mul``, CMSIS-NN ``arm_elementwise_mul_s8``):
        the offset product, the double multiplier's Q31 form with two roundings, clamped."""
        from etforge.runtime.arithmetic import tflite_int as ti

        acc = (a.astype(np.int64) - self.qa[1]) * (b.astype(np.int64) - self.qb[1])
        real = float(np.float32(self.qa[0])) * float(np.float32(self.qb[0])) / float(np.float32(self.qo[0]))
        return np.clip(ti.requantize(acc, real) + self.qo[1], self.low, self.high).astype(np.int8)


def _per_tensor(t: Any) -> tuple[float, int] | None:
    q = t.quantization
    if q is None or q.scale is None or len(q.scale) != 1 or q.zeroPoint is None or len(q.zeroPoint) != 1:
        return None
    return float(q.scale[0]), int(q.zeroPoint[0])


def _activation_range(schema: Any, act: int, scale: float, zero_point: int) -> tuple[int, int]:
    """``CalculateActivationRangeQuantized`` for int8."""
    from etforge.runtime.arithmetic import tflite_int as ti

    def q(v: float) -> int:
        return ti.quantize_value(v, scale, zero_point)

    f = schema.ActivationFunctionType
    bounds = {
        f.NONE: (-128, 127),
        f.RELU: (q(0.0), 127),
        f.RELU6: (q(0.0), q(6.0)),
        f.RELU_N1_TO_1: (q(-1.0), q(1.0)),
    }
    if act not in bounds:
        raise ValueError(f"int8 MUL with fused activation {act}: not computed here")
    lo, hi = bounds[act]
    return max(-128, lo), min(127, hi)


def _as_mul(schema: Any, model: Any, graph: Any, op: Any) -> _Mul | None:
    t = graph.tensors
    if len(op.inputs) != 2 or len(op.outputs) != 1:
        return None
    ts = [t[i] for i in (*op.inputs, *op.outputs)]
    if any(x.type != schema.TensorType.INT8 for x in ts):
        return None
    q = [_per_tensor(x) for x in ts]
    if any(x is None for x in q):
        return None
    act = op.builtinOptions.fusedActivationFunction if op.builtinOptions is not None else 0
    low, high = _activation_range(schema, act, *q[2])  # type: ignore[misc]
    constants = []
    for i in op.inputs:
        data = model.buffers[t[i].buffer].data if t[i].buffer else None
        if data is not None and len(data):
            constants.append(
                (int(i), np.frombuffer(bytes(data), np.int8).reshape([int(d) for d in t[i].shape]))
            )
    a, b, out = (int(i) for i in (*op.inputs, *op.outputs))
    return _Mul(a, b, out, q[0], q[1], q[2], low, high, tuple(constants))  # type: ignore[arg-type]


#: A step of a cut partition: a LiteRT model (bytes, its input and output tensor ids) or a MUL.
_Step = tuple[bytes, tuple[int, ...], tuple[int, ...]] | _Mul


@lru_cache(maxsize=16)
def _steps(model: bytes) -> tuple[tuple[_Step, ...], tuple[int, ...], tuple[int, ...]] | None:
    """``model`` cut at its int8 MULs (steps in order, graph inputs, graph outputs); None when
    it has none. Each LiteRT piece keeps every buffer; its inputs are the tensors it reads from
    earlier steps, its outputs those later steps or the graph read."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    m = schema.ModelT.InitFromPackedBuf(bytearray(model), 0)
    if len(m.subgraphs) != 1:
        return None
    graph = m.subgraphs[0]
    code = schema.BuiltinOperator.MUL
    muls = {}
    for k, op in enumerate(graph.operators):
        oc = m.operatorCodes[op.opcodeIndex]
        if max(int(oc.builtinCode), int(oc.deprecatedBuiltinCode)) == code and (
            mul := _as_mul(schema, m, graph, op)
        ):
            muls[k] = mul
    if not muls:
        return None
    ops = list(graph.operators)
    groups: list[list[int] | _Mul] = []
    for k in range(len(ops)):
        if k in muls:
            groups.append(muls[k])
        elif groups and isinstance(groups[-1], list):
            groups[-1].append(k)
        else:
            groups.append([k])
    constant = {
        i
        for i, t in enumerate(graph.tensors)
        if t.buffer and m.buffers[t.buffer].data is not None and len(m.buffers[t.buffer].data)
    }
    graph_inputs, graph_outputs = [int(i) for i in graph.inputs], [int(i) for i in graph.outputs]
    reads_after: list[set[int]] = []  # per group, tensors read by later groups or the graph's outputs
    later: set[int] = set(graph_outputs)
    for g in reversed(groups):
        reads_after.append(set(later))
        later |= (
            {g.a, g.b} - constant
            if isinstance(g, _Mul)
            else {int(i) for k in g for i in ops[k].inputs if i >= 0}
        )
    reads_after.reverse()
    steps: list[_Step] = []
    for g, after in zip(groups, reads_after, strict=True):
        if isinstance(g, _Mul):
            steps.append(g)
            continue
        made = {int(i) for k in g for i in ops[k].outputs}
        read = [int(i) for k in g for i in ops[k].inputs if i >= 0]
        ins = tuple(dict.fromkeys(i for i in read if i not in made and i not in constant))
        outs = tuple(sorted(made & after))
        if not outs:  # nothing later reads what these ops make
            continue
        graph.operators, graph.inputs, graph.outputs = [ops[k] for k in g], list(ins), list(outs)
        b = flatbuffers.Builder(len(model) + 1024)
        b.Finish(m.Pack(b), file_identifier=b"TFL3")
        steps.append((bytes(b.Output()), ins, outs))
    return tuple(steps), tuple(graph_inputs), tuple(graph_outputs)
