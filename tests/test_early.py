"""Early delegation (core/lower/early.py) against the classic path it replaces.

The classic path (ExecuTorch's ``to_edge_transform_and_lower`` over the whole program) is the
reference: on the same quantized program the early path must give structurally identical
LiteRT partitions, the same per-node decisions and the same CPU program, and the compiled
result must match the quantized reference on the host.
"""

from __future__ import annotations

import collections

import flatbuffers
import pytest
import torch
from ai_edge_litert import schema_py_generated as schema

from etforge.core.build import pipeline
from etforge.core.graph.utils import node_op
from etforge.core.lower import driver
from etforge.core.lower import early as early_module
from etforge.core.registry.manager import registry
from etforge.runtime.execution.host import run_program


class ConvHead(torch.nn.Module):
    """conv2d + batch norm + relu6 + eval dropout + flatten + linear: composite ATen ops that
    to_edge decomposes (conv2d, dropout, flatten) next to ones the NPU keeps whole (linear)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.drop = torch.nn.Dropout(0.2)
        self.fc = torch.nn.Linear(8 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.relu6(self.bn(self.conv(x)))
        return self.fc(torch.flatten(self.drop(y), 1))


class Attention(torch.nn.Module):
    """matmul of a transposed view, softmax, reshape: views whose copies change strides."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)
        self.out = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).reshape(1, 8, 3, 2, 8).permute(2, 0, 3, 1, 4)
        a = torch.softmax(q @ k.transpose(-2, -1) * 0.35, dim=-1)
        return self.out((a @ v).transpose(1, 2).reshape(1, 8, 16))


CASES = {"conv_head": (ConvHead, (1, 3, 8, 8)), "attention": (Attention, (1, 8, 16))}


def _quantized(name: str, target: str) -> tuple[object, ...]:
    cls, shape = CASES[name]
    torch.manual_seed(0)
    model = cls().eval()
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(*shape, generator=g),) for _ in range(4)]
    reg = registry()
    tgt = reg.target(target)
    opts = tgt.option_defaults()
    ep = pipeline.export(model, calib[0])
    ep, _ = pipeline.rewrite(ep, tgt, reg)
    return pipeline.quantize(ep, tgt, calib, reg, opts), tgt, opts, reg, calib


def _structure(tflite: bytes) -> bytes:
    """The LiteRT model without tensor names and metadata (those name graph nodes, which the
    two paths name differently)."""
    model = schema.ModelT.InitFromObj(schema.Model.GetRootAsModel(tflite, 0))
    kept = len(model.buffers) - len(model.metadata or [])
    model.buffers, model.metadata = model.buffers[:kept], []
    for sg in model.subgraphs:
        sg.name = b""
        for t in sg.tensors:
            t.name = b""
    b = flatbuffers.Builder(0)
    b.Finish(model.Pack(b), b"TFL3")
    return bytes(b.Output())


def _normal(op: str) -> str:
    """Edge spells a few ops differently from the ATen graph the early path decides on."""
    return op.replace("dim_order_ops._clone_dim_order", "aten.clone").replace("_copy.", ".")


@pytest.mark.parametrize("target", ["imxrt700", "imxrt700cm"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_early_delegation_matches_the_classic_path(name: str, target: str) -> None:
    q, tgt, opts, reg, calib = _quantized(name, target)
    classic = pipeline.lower(q, tgt, opts, reg, early=False)
    early = pipeline.lower(q, tgt, opts, reg)
    assert "delegate (early)" in early[3] and "delegate (classic)" in classic[3]
    assert len(early[2]) == len(classic[2]) >= 1
    for a, b in zip(classic[2], early[2], strict=True):
        assert _structure(a.converted.tflite) == _structure(b.converted.tflite), a.name
        assert a.converted.input_dim_orders == b.converted.input_dim_orders
        assert a.converted.output_dim_orders == b.converted.output_dim_orders

    def decided(r: tuple[object, ...]) -> collections.Counter[tuple[str, bool]]:
        return collections.Counter((_normal(d.op), d.npu) for d in r[1].decisions)  # type: ignore[attr-defined]

    def cpu_ops(r: tuple[object, ...]) -> list[str]:
        # Known difference: a CPU matmul of a transposed NPU output is decomposed with a layout
        # clone on the early path (its decomposition sees the view's strides); values agree.
        graph = r[0].exported_program().graph  # type: ignore[attr-defined]
        ops = [node_op(n) for n in graph.nodes if n.op == "call_function"]
        return [op for op in ops if op != "dim_order_ops._clone_dim_order.default"]

    assert decided(early) == decided(classic)
    assert cpu_ops(early) == cpu_ops(classic)
    # The early program runs and matches the quantized reference within one output step.
    program = early[0].exported_program()
    ref = q.module()(*calib[1])
    out = run_program(program, calib[1])[0]
    scale = float(next(n for n in program.graph.nodes if n.op == "output").args[0][0].args[1])
    assert float((out - ref).abs().max()) <= 1.001 * scale


@pytest.mark.parametrize("name", sorted(CASES))
def test_without_an_npu_the_early_decomposition_gives_the_classic_bytes(name: str) -> None:
    """cortex-m33: nothing to delegate; the node-by-node decomposition replaces to_edge's
    re-tracing one (the early path's speed) and the .pte is the classic path's, byte for byte."""
    from etforge.core.build.session import compile_model

    cls, shape = CASES[name]
    torch.manual_seed(0)
    model = cls().eval()
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(*shape, generator=g),) for _ in range(3)]
    early = compile_model(model, calib[0], "cortex-m33", calibration=calib)
    classic = compile_model(model, calib[0], "cortex-m33", calibration=calib, early=False)
    assert early.lowering["path"] == "early" and classic.lowering["path"] == "classic"
    # a static program: no symbolic value for SymToTensorPass (core/lower/edge_passes.py)
    assert "SymToTensorPass" in early.lowering["edge_passes_skipped"]
    assert "edge_passes_skipped" not in classic.lowering
    assert not early.partitions and early.fallbacks == classic.fallbacks
    assert early.pte == classic.pte


def test_debug_handles_are_the_classic_paths() -> None:
    """to_edge numbers the remainder afresh; the early path gives every node the handle its
    origin had before delegation, so profiler rows (delegate debug maps and CPU ops) map back
    to the same source nodes as on the classic path."""
    from executorch.exir.delegate import executorch_call_delegate

    q, tgt, opts, reg, _ = _quantized("attention", "imxrt700")

    def handles(early: bool) -> tuple[list[list[int]], list[tuple[str, int | None]]]:
        ep = pipeline.lower(q, tgt, opts, reg, early=early)[0].exported_program()
        maps, cpu = [], []
        for n in ep.graph.nodes:
            if n.op != "call_function":
                continue
            if n.target is executorch_call_delegate:
                lowered = getattr(ep.graph_module, str(n.args[0].target))
                maps.append(sorted(h for hs in lowered.meta["debug_handle_map"].values() for h in hs))
            elif node_op(n) != "dim_order_ops._clone_dim_order.default":
                cpu.append((node_op(n), n.meta.get("debug_handle")))
        return maps, sorted(cpu, key=str)

    maps, cpu = handles(True)
    assert maps and all(maps) and all(h is not None for _, h in cpu)
    assert (maps, cpu) == handles(False)


_LIB = torch.library.Library("etforge_cia_test", "DEF")
_LIB.define("twice(Tensor x) -> Tensor")
_LIB.impl("twice", lambda x: x * 2, "CompositeImplicitAutograd")


def _same(a: object, b: object) -> bool:
    """One decomposition (each table wraps composite ops in its own ``partial``)."""
    import functools

    if isinstance(a, functools.partial) and isinstance(b, functools.partial):
        return a.func.__qualname__ == b.func.__qualname__ and a.keywords == b.keywords
    return a is b


def test_decomposition_dict_reads_the_table_without_materializing_it() -> None:
    """The graph's ops get the entries the materialized table has; no namespace walk."""
    from executorch.exir.tracer import _default_decomposition_table

    twice = torch.ops.etforge_cia_test.twice.default
    aten = torch.ops.aten
    ops = {aten.linear.default, aten.dropout.default, aten.conv2d.default, aten.add.Tensor, twice}
    table = _default_decomposition_table()
    ours = driver._decomposition_dict(table, ops)
    assert not table.has_materialized
    full = dict(_default_decomposition_table().items())
    assert twice in full and twice in ours
    x = torch.arange(4.0)
    assert torch.equal(ours[twice](x), full[twice](x))
    for op in ops - {twice}:
        assert (op in ours) == (op in full), op
        assert _same(ours.get(op), full.get(op)), op
    assert {k for k in full if k.namespace == "aten"} == {k for k in ours if k.namespace == "aten"}


def _channels_last_head() -> tuple[torch.nn.Module, list[tuple[torch.Tensor, ...]]]:
    from support import conv_head

    model, batches = conv_head(calibration=3)
    model = model.to(memory_format=torch.channels_last)
    return model, [tuple(t.to(memory_format=torch.channels_last) for t in batch) for batch in batches]


def test_a_channels_last_global_pool_takes_the_early_path() -> None:
    """A channels-last adaptive average pool decomposes to mean + ``as_strided_`` (restoring
    its strides); traced again on contiguous inputs it is a plain mean with the same [N, C,
    1, 1] layout, so the early path keeps it (convnext's pool) and the program verifies."""
    import etforge

    model, calib = _channels_last_head()
    compiled = etforge.compile(model, calib[0], target="litert", calibration=calib)
    assert compiled.report["lowering"]["path"] == "early", compiled.report["lowering"]
    ops = {str(n.target) for n in compiled.result.host_program.graph.nodes if n.op == "call_function"}
    assert not [op for op in ops if "as_strided" in op], ops
    verification = compiled.verify(samples=3)
    assert verification.ok, verification.failures


def test_a_decomposition_that_mutates_falls_back_to_the_classic_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """When the contiguous re-trace would lay the output out differently, the mutation
    stays, and the early path steps aside (before, the program failed ExecuTorch's
    functional-IR check): recorded as a fallback, the classic path's bytes."""
    from etforge.core.build.session import compile_model

    monkeypatch.setattr(early_module, "_same_layout", lambda sub, node: False)
    model, calib = _channels_last_head()
    early = compile_model(model, calib[0], "litert", calibration=calib)
    classic = compile_model(model, calib[0], "litert", calibration=calib, early=False)
    assert early.pte == classic.pte
    assert early.lowering["path"] == "classic" and early.lowering["fallback"], early.lowering
    assert "edge_passes_skipped" not in early.lowering  # the classic path runs every Edge pass
    lowered = [f for f in early.fallbacks if f.stage == "lower"]  # (+ float CPU ops, float_ops.py)
    assert [(f.stage, f.what) for f in lowered] == [("lower", "lowered the classic way (slower)")]
    assert "adaptive_avg_pool2d" in lowered[0].why and "mutates" in lowered[0].why
