"""ExecuTorch's Cortex-M pass lists, run without the re-traces that change nothing.

Most of these passes are ``ExportPass``es: each re-traces the whole graph with fake tensors
(0.2-0.7 s on a 1,500-node int8 graph) even when no node matches its rule. A re-trace alone
only renames nodes and refreshes their meta, and re-tracing is idempotent, so a pass with
nothing to do may be left out whenever a pass after it re-traces the graph anyway: the
output is byte-identical and the compile faster. Each "has work" test below is a cheap
scan under the pass's own rule (the ops it matches); a pass not known here, or any graph
with control flow, runs as ExecuTorch runs it. The last pass of a list that always
re-traces (the anchor) runs, so every skip is followed by a re-trace; before it,
RemoveGetItemPass runs without its own closing re-trace, which only refreshed meta. An
always-re-tracing pass with nothing to do right after another one ran (the graph is a
re-trace's output, and a re-trace of that is the same graph) is left out too, the anchor
included: a classifier's DecomposeMeanPass re-traces, so MatmulToBmmPass need not.

The lists are ExecuTorch's own (``CortexMPassManager``); this module only runs them the
way ``CortexMPassManager.transform`` and ``transform_for_annotation`` do. ``SKIP`` set to
False runs ExecuTorch's own pass manager and quantizer instead (the reference, for tests).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from executorch.exir.pass_base import ExportPass
    from torch.export import ExportedProgram
    from torch.fx import GraphModule
    from torchao.quantization.pt2e.quantizer import Quantizer

#: False: run ExecuTorch's own CortexMPassManager and CortexMQuantizer (the reference).
SKIP = True

#: Pass names skipped by the last run of each list, and those run without their closing
#: re-trace ("in_place"), for tests and profiling.
last_skipped: dict[str, list[str]] = {"transform": [], "annotation": [], "in_place": []}

#: Higher-order ops whose subgraphs the scans below do not look into.
_CONTROL_FLOW = ("cond", "map_impl", "while_loop", "scan")

#: Passes that re-trace the whole graph every time they run, whether or not they change it.
_ALWAYS_RETRACE = (
    "RemoveGetItemPass",
    "ReplaceScalarWithTensorArgPass",
    "ReplaceQuantNodesPass",
    "ClampHardswishPass",
    "DecomposeMeanPass",
    "MatmulToBmmPass",
)


def _calls(gm: GraphModule, targets: Collection[object]) -> bool:
    """Does the graph call any of these targets?"""
    return any(n.op == "call_function" and n.target in targets for n in gm.graph.nodes)


def _calls_named(gm: GraphModule, names: Collection[str]) -> bool:
    """Does the graph call an op of one of these ``__name__``s (RemoveGetItemPass's test)?"""
    return any(n.op == "call_function" and getattr(n.target, "__name__", "") in names for n in gm.graph.nodes)


def _remove_getitem_work(gm: GraphModule) -> bool:
    return _calls_named(gm, ("aten.max_pool2d_with_indices.default", "aten.max.dim"))


def _scalar_arg_work(gm: GraphModule) -> bool:
    from executorch.backends.transforms.replace_scalar_with_tensor import ReplaceScalarWithTensorArgPass

    return _calls(gm, ReplaceScalarWithTensorArgPass.default_ops)


def _hardswish_work(gm: GraphModule) -> bool:
    import torch

    return _calls(gm, (torch.ops.aten.hardswish.default, torch.ops.aten.hardswish_.default))


def _mean_work(gm: GraphModule) -> bool:
    import torch

    return _calls(gm, (torch.ops.aten.adaptive_avg_pool2d.default, torch.ops.aten.mean.dim))


def _matmul_work(gm: GraphModule) -> bool:
    import torch

    return _calls(gm, (torch.ops.aten.matmul.default,))


#: Per skippable pass, the scan that says it has something to rewrite: the pass's own op
#: set (an op present counts as work even where the pass's finer conditions would decline).
_HAS_WORK: dict[str, Callable[[GraphModule], bool]] = {
    "RemoveGetItemPass": _remove_getitem_work,
    "ReplaceScalarWithTensorArgPass": _scalar_arg_work,
    "ClampHardswishPass": _hardswish_work,
    "DecomposeMeanPass": _mean_work,
    "MatmulToBmmPass": _matmul_work,
}


def has_control_flow(gm: GraphModule) -> bool:
    """Does the graph hold a cond/map/while (whose subgraphs the scans do not read)?"""
    return any(
        n.op == "call_function" and getattr(n.target, "__name__", "") in _CONTROL_FLOW for n in gm.graph.nodes
    )


def _anchor(names: Sequence[str]) -> int:
    """Index of the last pass that always re-traces: it always runs, so every pass skipped
    before it is followed by a re-trace (-1: none, nothing is skipped)."""
    return max((i for i, name in enumerate(names) if name in _ALWAYS_RETRACE), default=-1)


def skippable(name: str, index: int, anchor: int, gm: GraphModule, fresh: bool = False) -> bool:
    """May the pass at ``index`` be left out of this graph? Only a known pass with nothing
    to do: before the anchor re-trace, or, if it only re-traces when idle, on a graph
    ``fresh`` from an always-re-tracing pass (no pass run since)."""
    check = _HAS_WORK.get(name)
    before_anchor = index < anchor
    after_a_re_trace = anchor >= 0 and fresh and name in _ALWAYS_RETRACE
    return SKIP and check is not None and (before_anchor or after_a_re_trace) and not check(gm)


def _in_place(pass_cls: type[ExportPass]) -> type[ExportPass]:
    """RemoveGetItemPass without its closing re-trace: its own code (the ``super().call``
    it ends with resolves to a no-op placed before ExportPass in the MRO). Only used where a
    later pass re-traces the graph anyway."""
    from executorch.exir.pass_base import ExportPass, PassResult

    class _NoRetrace(ExportPass):
        def call(self, graph_module: GraphModule) -> PassResult:
            return PassResult(graph_module, True)

    return type(pass_cls.__name__, (pass_cls, _NoRetrace), {})  # same name in error messages


#: Passes that edit the graph in place and then re-trace it whole (only to refresh meta).
_IN_PLACE_THEN_RETRACE = ("RemoveGetItemPass",)


def _instantiate(pass_cls: type[ExportPass], ep: ExportedProgram, target_config: Any) -> ExportPass:
    """Construct a pass as CortexMPassManager.transform does (keyword injection by signature)."""
    parameters = inspect.signature(pass_cls).parameters
    kwargs: dict[str, Any] = {}
    if "exported_program" in parameters:
        kwargs["exported_program"] = ep
    if "target_config" in parameters:
        kwargs["target_config"] = target_config
    return pass_cls(**kwargs)


def transform(ep: ExportedProgram, passes: Sequence[type[ExportPass]], target_config: Any) -> ExportedProgram:
    """``CortexMPassManager(ep, passes, target_config).transform()``, skipping idle re-traces."""
    from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager
    from executorch.exir.program._program import _transform, lift_constant_tensor_pass

    if not SKIP:
        return CortexMPassManager(ep, passes=list(passes), target_config=target_config).transform()
    names = [p.__name__ for p in passes]
    anchor = -1 if has_control_flow(ep.graph_module) else _anchor(names)
    skipped: list[str] = []
    in_place: list[str] = []
    fresh = False  # is the graph an always-re-tracing pass's output, no pass run since?
    for index, pass_cls in enumerate(passes):
        if not isinstance(pass_cls, type):
            raise ValueError(f"Cortex-M pass lists hold pass classes, not instances; got {pass_cls!r}")
        if skippable(names[index], index, anchor, ep.graph_module, fresh):
            skipped.append(names[index])
            continue
        fresh = names[index] in _ALWAYS_RETRACE
        if index < anchor and names[index] in _IN_PLACE_THEN_RETRACE:
            pass_cls = _in_place(pass_cls)
            in_place.append(names[index])
            fresh = False
        ep = _transform(ep, _instantiate(pass_cls, ep, target_config))
    last_skipped["transform"] = skipped
    last_skipped["in_place"] = in_place
    return lift_constant_tensor_pass(ep)


def transform_for_annotation(
    model: GraphModule, passes: Sequence[type[ExportPass]] | None = None
) -> GraphModule:
    """``CortexMPassManager.transform_for_annotation``, skipping idle re-traces."""
    from executorch.backends.cortex_m.passes.cortex_m_pass_manager import CortexMPassManager

    passes = CortexMPassManager.pass_list_transform_for_annotation if passes is None else passes
    names = [p.__name__ for p in passes]
    anchor = -1 if has_control_flow(model) else _anchor(names)
    skipped: list[str] = []
    fresh = False  # is the graph an always-re-tracing pass's output, no pass run since?
    for index, pass_cls in enumerate(passes):
        if skippable(names[index], index, anchor, model, fresh):
            skipped.append(names[index])
            continue
        fresh = names[index] in _ALWAYS_RETRACE
        model = pass_cls().call(model).graph_module
    last_skipped["annotation"] = skipped
    return model


def quantizer() -> Quantizer:
    """ExecuTorch's CortexMQuantizer whose pre-annotation passes skip idle re-traces."""
    from executorch.backends.cortex_m.quantizer.quantizer import CortexMQuantizer

    if not SKIP:
        return CortexMQuantizer()

    class SkippingCortexMQuantizer(CortexMQuantizer):
        def transform_for_annotation(self, model: GraphModule) -> GraphModule:
            return transform_for_annotation(model)

    return SkippingCortexMQuantizer()
