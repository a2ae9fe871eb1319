"""The LiteRT builder: bytes the interpreter reads back exactly as written."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from ai_edge_litert import schema_py_generated as schema
from ai_edge_litert.interpreter import Interpreter

from etforge.core.litert.builder import LiteRTBuilder, Quant, options, read_metadata
from etforge.testing import check_op


def _model_with_shared_constants() -> bytes:
    b = LiteRTBuilder()
    x = b.add_tensor((1, 4), "float32", "x")
    c1 = b.add_tensor((1, 4), "float32", "c1", data=np.arange(4, dtype=np.float32).reshape(1, 4))
    c2 = b.add_tensor((1, 4), "float32", "c2", data=np.arange(4, dtype=np.float32).reshape(1, 4))
    y = b.add_tensor((1, 4), "float32", "y")
    z = b.add_tensor((1, 4), "float32", "z")
    g = b.add_tensor((1, 4), "float32", "g")
    b.inputs.append(x)
    b.add_operator("ADD", [x, c1], [y], options("AddOptions"), name="add")
    b.add_operator("MUL", [y, c2], [z], options("MulOptions"), name="mul")
    b.add_operator("GELU", [z], [g], options("GeluOptions"), name="gelu")  # builtin code > 127
    b.outputs.append(g)
    return b.finish({0: [3], 1: [4], 2: [4, 5]})


def test_constants_deduplicated_and_model_runs() -> None:
    data = _model_with_shared_constants()
    model = schema.ModelT.InitFromPackedBuf(data, 0)
    tensors = model.subgraphs[0].tensors
    assert tensors[1].buffer == tensors[2].buffer != 0
    it = Interpreter(model_content=data)
    it.allocate_tensors()
    x = np.array([[0.5, -1.0, 2.0, 0.0]], np.float32)
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    got = it.get_tensor(it.get_output_details()[0]["index"])
    z = torch.tensor((x + np.arange(4)) * np.arange(4), dtype=torch.float32)
    np.testing.assert_allclose(got, torch.nn.functional.gelu(z).numpy(), rtol=1e-3, atol=1e-4)


def test_metadata_debug_map_and_op_names_round_trip() -> None:
    meta = read_metadata(_model_with_shared_constants())
    assert json.loads(meta["etforge_debug_handles"]) == {"0": [3], "1": [4], "2": [4, 5]}
    assert json.loads(meta["etforge_op_names"]) == ["add", "mul", "gelu"]


def test_constant_buffers_are_16_byte_aligned() -> None:
    data = _model_with_shared_constants()
    model = schema.Model.GetRootAs(data, 0)
    graph = model.Subgraphs(0)
    constant_buffers = {graph.Tensors(i).Buffer() for i in range(graph.TensorsLength())} - {0}
    assert constant_buffers
    for i in constant_buffers:
        buf = model.Buffers(i)
        if buf.DataLength():
            offset = buf._tab.Vector(buf._tab.Offset(4))
            assert offset % 16 == 0


def test_per_channel_quantization_round_trips() -> None:
    b = LiteRTBuilder()
    w = np.arange(24, dtype=np.int8).reshape(3, 2, 2, 2)
    q = Quant((0.1, 0.2, 0.3), (0, 0, 0), axis=0)
    idx = b.add_tensor(w.shape, "int8", "w", data=w, quant=q)
    x = b.add_tensor((1, 2), "float32", "x")
    b.inputs.append(x)
    b.outputs.append(x)
    model = schema.ModelT.InitFromPackedBuf(b.finish(), 0)
    t = model.subgraphs[0].tensors[idx]
    assert list(t.quantization.scale) == pytest.approx([0.1, 0.2, 0.3])
    assert list(t.quantization.zeroPoint) == [0, 0, 0] and t.quantization.quantizedDimension == 0
    assert bytes(np.asarray(model.buffers[t.buffer].data, np.uint8)) == w.tobytes()


def test_unknown_fields_and_ops_are_errors() -> None:
    with pytest.raises(ValueError, match="no field 'strideX'"):
        options("Conv2DOptions", strideX=1)
    with pytest.raises(ValueError, match="unknown builtin operator 'CONV3'"):
        LiteRTBuilder().add_operator("CONV3", [], [])


def test_conversion_is_deterministic() -> None:
    torch.manual_seed(0)
    conv = torch.nn.Sequential(
        torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(64, 3)
    )
    x = (torch.randn(1, 3, 4, 4),)
    from etforge.core.build import pipeline
    from etforge.core.registry.manager import registry

    target = registry().target("litert")
    blobs = []
    for _ in range(2):
        ep = pipeline.quantize(pipeline.export(conv, x), target, [x])
        _, _, parts, _ = pipeline.lower(ep, target)
        blobs.append(b"".join(p.converted.tflite for p in parts))
    assert blobs[0] == blobs[1]
    check_op(conv, x)
