"""``to_edge``'s own passes, each re-tracing pass run only where the graph holds work for it.

ExecuTorch's ``_generate_edge_program`` runs a dozen passes over the program. The ``ExportPass``
ones re-trace all of it with fake tensors, 0.6–1.2 s each on a 1,500-node int8 graph, even
when no node matches what they rewrite (a static program has no symbolic sizes for
``SymToTensorPass``; ``early.prepare`` already made every view a ``*_copy`` and every scalar a
tensor). Here each re-tracing pass is first asked, by a scan under its own rule, whether it
would change a node: a pass with nothing to do is skipped, which is what its re-trace would
have given, because ``OpReplacePass`` (which changes every node) always runs and re-traces
the graph once more, so node names and meta still come from a re-trace; ``MemoryFormatOpsPass``
rides on that same re-trace (:func:`_edge_ops`). Graph-editing
passes run as always; a pass this module does not know runs too, and a graph with control
flow runs everything. torch's own ``ReplaceViewOpsWithViewCopyOpsPass`` is skipped the same
way when no view op is left (``early.prepare`` made each one its ``*_copy``) on a program
without delegates (a CPU-only target): mnasnet0_5 on cortex-m33 lowers in 1.9 s instead of
3.2 s, the ``.pte`` byte-identical. (When this module was written, skipping it made a later
``run_decompositions`` in the same process crash in the garbage collector, in
tests/test_early.py; that suite now runs clean with it skipped on CPU-only programs, and the
old crash's cause was never found.) ``tests/test_edge_passes.py`` holds the result
byte-identical to ExecuTorch's own sequence on graphs that make every pass act.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node

#: Whether a re-tracing pass has work on a graph (a scan under the pass's own rule).
Rule = Callable[[GraphModule], bool]


def edge_program(
    config: Any, program: ExportedProgram, preserve_ops: list[Any]
) -> tuple[ExportedProgram, list[str]]:
    """``_generate_edge_program(config, program, preserve_ops=...)``, the same program, faster.

    Returns the Edge program and the names of the passes skipped (they had nothing to do)."""
    from executorch.exir.passes import OpReplacePass
    from executorch.exir.passes.remove_graph_asserts_pass import RemoveNonCoreAtenOpGraphAssertsPass
    from executorch.exir.passes.remove_unused_parameters_pass import remove_unused_parameters_pass
    from executorch.exir.program import _program as ep_program
    from executorch.exir.verification.verifier import EXIREdgeDialectVerifier
    from torch._export.passes.replace_view_ops_with_view_copy_ops_pass import (
        ReplaceViewOpsWithViewCopyOpsPass,
    )

    program = remove_unused_parameters_pass(program)
    pre, post = ep_program._get_aten_to_edge_passes(config)
    passes: list[Any] = [RemoveNonCoreAtenOpGraphAssertsPass(), ReplaceViewOpsWithViewCopyOpsPass(), *pre]
    # OpReplacePass then MemoryFormatOpsPass: one re-trace does both (_edge_ops).
    passes.append(OpReplacePass() if config._skip_dim_order else _edge_ops())
    gm = program.graph_module
    skipped: list[str] = []
    for p in passes:
        name = type(inspect.unwrap(p)).__name__
        rule = RULES.get(name)
        if rule is not None and _plain(gm) and not rule(gm):
            skipped.append(name)
            continue
        result = p(gm)
        assert result is not None
        gm = result.graph_module
    edge = ExportedProgram(
        root=gm,
        graph=gm.graph,
        graph_signature=ep_program._get_updated_graph_signature(program.graph_signature, gm),
        state_dict=program.state_dict,
        range_constraints=program.range_constraints,
        module_call_graph=program.module_call_graph,
        example_inputs=program.example_inputs,
        constants=program.constants,
        verifiers=[
            EXIREdgeDialectVerifier(
                edge_compile_config=config,
                class_only=True,
                core_aten_ops_exception_list=None,
                preserve_ops=preserve_ops,
            )
        ],
    )
    edge = ep_program.lift_constant_tensor_pass(edge)
    edge = ep_program.convert_constant_dim_order_pass.convert_constant_dim_order_pass(edge)
    return ep_program._transform(edge, *post), skipped


def _edge_ops() -> Any:
    """``OpReplacePass`` and ``MemoryFormatOpsPass`` in one re-trace.

    Run one after the other, each re-traces the whole program: the first to make every op
    its Edge op, the second to give the Edge ops that take a ``memory_format`` (``_to_copy``,
    ``clone``) their ``dim_order`` form. Each op's rewrite reads only the op and its arguments'
    values, which are the same in one re-trace as in two, so each op is made its Edge op and
    then handed to the memory-format rule as the second re-trace would see it."""
    from executorch.exir.passes import MemoryFormatOpsPass
    from executorch.exir.passes.replace_aten_with_edge_pass import aten_to_edge, should_lower_to_edge

    class EdgeOpsWithDimOrders(MemoryFormatOpsPass):
        def call_operator(self, op: Any, args: Any, kwargs: Any, meta: Any) -> Any:
            return super().call_operator(
                aten_to_edge(op) if should_lower_to_edge(op) else op, args, kwargs, meta
            )

    return EdgeOpsWithDimOrders()


def _calls(gm: GraphModule) -> Iterator[Node]:
    return (n for n in gm.graph.nodes if n.op == "call_function")


def _plain(gm: GraphModule) -> bool:
    """Only ops, ``getitem`` and delegate calls: no control flow whose bodies a re-trace enters."""
    import operator

    from executorch.exir.delegate import executorch_call_delegate

    return all(
        _is_op(n.target) or n.target in (operator.getitem, executorch_call_delegate) for n in _calls(gm)
    )


def _is_op(target: Any) -> bool:
    from executorch.exir.dialects.edge._ops import EdgeOpOverload

    return isinstance(target, (torch._ops.OpOverload, EdgeOpOverload))


def _overloads(gm: GraphModule) -> Iterator[Node]:
    return (n for n in _calls(gm) if _is_op(n.target))


def _schema_values(node: Node) -> Iterator[tuple[Any, Any]]:
    """(value, schema argument) for every argument given, as ExecuTorch's ``map_args`` pairs them."""
    for i, arg in enumerate(node.target._schema.arguments):
        if arg.name in node.kwargs:
            yield node.kwargs[arg.name], arg
        elif not arg.kwarg_only and i < len(node.args):
            yield node.args[i], arg


def _val(value: Any) -> Any:
    return value.meta.get("val") if isinstance(value, Node) else value


def _views(gm: GraphModule) -> bool:
    """ReplaceViewOpsWithViewCopyOpsPass: a view op with a ``*_copy`` form (or one missing it:
    the pass's own error); and always on a program holding delegates (without this re-trace
    the Cortex-M lowering's copy of such a program failed, ``KeyError: getitem`` in fx's graph
    copy, on the architecture suite's multi_io and transformer on imxrt700cm)."""
    from executorch.exir.delegate import executorch_call_delegate
    from torch._export.error import InternalError
    from torch._export.passes.replace_view_ops_with_view_copy_ops_pass import get_view_copy_of_view_op

    for n in _calls(gm):
        if n.target is executorch_call_delegate:
            return True
        if n.target == torch.ops.aten._unsafe_view.default:
            return True
        if isinstance(n.target, torch._ops.OpOverload):
            try:
                if get_view_copy_of_view_op(n.target._schema) is not None:
                    return True
            except InternalError:
                return True
    return False


def _transposes(gm: GraphModule) -> bool:
    """NormalizeTransposePass: ``aten.t``."""
    return any(n.target == torch.ops.aten.t.default for n in _calls(gm))


def _broken(gm: GraphModule) -> bool:
    """ReplaceBrokenOpsWithFunctionalOpsPass: any view op."""
    return any(getattr(n.target, "is_view", True) for n in _overloads(gm))


def _scalars(gm: GraphModule) -> bool:
    """ScalarToTensorPass: a Python number where the schema takes a Tensor."""
    return any(
        isinstance(value, (bool, int, float)) and isinstance(arg.type, torch.TensorType)
        for node in _overloads(gm)
        for value, arg in _schema_values(node)
    )


def _symbols(gm: GraphModule) -> bool:
    """SymToTensorPass: any symbolic value in the graph (a static program has none)."""
    return any(
        isinstance(n.meta.get("val"), (torch.SymInt, torch.SymFloat, torch.SymBool)) for n in gm.graph.nodes
    )


def _mixed_types(gm: GraphModule) -> bool:
    """RemoveMixedTypeOperators: a binary op whose tensor operand is not of the promoted dtype."""
    from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND as KIND
    from torch._prims_common import elementwise_dtypes

    aten = torch.ops.aten
    kinds = {
        aten.add.Tensor: KIND.DEFAULT,
        aten.mul.Tensor: KIND.DEFAULT,
        aten.sub.Tensor: KIND.DEFAULT,
        aten.div.Tensor: KIND.INT_TO_FLOAT,
        aten.div.Tensor_mode: KIND.DEFAULT,
        aten.minimum.default: KIND.DEFAULT,
    }
    for node in _overloads(gm):
        if node.target not in kinds or len(node.args) <= 1:
            continue
        kind = kinds[node.target]
        if node.target == aten.div.Tensor_mode and node.kwargs.get("rounding_mode") is None:
            kind = KIND.INT_TO_FLOAT
        operands = [_val(a) for a in node.args]
        if any(isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) for v in operands):
            return True
        promoted = elementwise_dtypes(*operands, type_promotion_kind=kind)[1]
        for value, arg in _schema_values(node):
            if not isinstance(arg.type, torch.TensorType):
                continue
            v = _val(value)
            if not (isinstance(v, torch.Tensor) and v.dtype == promoted):
                return True
    return False


#: The re-tracing passes that may be skipped, by class name; a pass absent here always runs.
RULES: dict[str, Rule] = {
    "ReplaceViewOpsWithViewCopyOpsPass": _views,
    "NormalizeTransposePass": _transposes,
    "ReplaceBrokenOpsWithFunctionalOpsPass": _broken,
    "ScalarToTensorPass": _scalars,
    "SymToTensorPass": _symbols,
    "RemoveMixedTypeOperators": _mixed_types,
}
