"""ExecuTorch's recipe API for etforge's targets: ``executorch.export.export(model, inputs, recipe)``.

Importing this module registers :class:`EtforgeRecipeProvider` with ExecuTorch's
``recipe_registry`` (as ``executorch.backends.xnnpack.recipes`` does for XNNPACK), with one
recipe type per target in etforge's plugin registry (``EtforgeRecipeType.IMXRT700CM``, ...,
and any installed target plugin's). A recipe composes, as ExecuTorch's own stages, what a
script with ``etforge.target(name)`` does (``docs/getting-started.md``):

* ``QUANTIZE``: the target's composed PT2E quantizer (its graph rewrites run in the
  quantizer's ``transform_for_annotation``); a ``pre_prepare`` pass puts the captured graph
  in the memory format the target keeps inside (``Target.adapt``: channels-last on Cortex-M
  targets); PTQ calibrates on every example input, QAT (``train_fn``) trains with the
  quantizer's fake-quantize specs (ExecuTorch's ``is_qat`` flow);
* ``TORCH_EXPORT``: the quantized graph exported with inputs in that memory format;
* ``TO_EDGE_TRANSFORM_AND_LOWER``: etforge's partitioner and the CPU backend's Edge config;
* ``EDGE_PROGRAM_MANAGER_TRANSFORM``: the CPU backend's lowering (CMSIS-NN on Cortex-M);
* ``TO_EXECUTORCH``: etforge's memory planning (and ``memory_budget``, when given).

With ``lowering="early"`` (the default) an ``aten_transform`` pass delegates the NPU
partitions on the quantized ATen program first, as ``etforge compile`` does, and the
``.pte`` is byte for byte ``etforge compile``'s; with ``lowering="classic"`` it is a
script's (``etforge.compile(..., lowering="classic")``). ``etforge verify PTE --model ...``
checks either.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from executorch.exir import EdgeProgramManager, ExecutorchBackendConfig
from executorch.export import (
    BackendRecipeProvider,
    ExportRecipe,
    LoweringRecipe,
    QuantizationRecipe,
    RecipeType,
    StageType,
    recipe_registry,
)
from torch.export import ExportedProgram

from etforge.api import Target, _example_like, _quiet
from etforge.api import target as make_target
from etforge.core.common.errors import EtforgeError
from etforge.core.registry.manager import registry

#: The backend name recipes are registered under (``ExportRecipe.get_recipe`` looks it up).
BACKEND = "etforge"

#: The stages an etforge recipe runs, in order (ExecuTorch's; none of etforge's own).
PIPELINE = [
    StageType.SOURCE_TRANSFORM,
    StageType.QUANTIZE,
    StageType.TORCH_EXPORT,
    StageType.TO_EDGE_TRANSFORM_AND_LOWER,
    StageType.EDGE_PROGRAM_MANAGER_TRANSFORM,
    StageType.TO_EXECUTORCH,
]


class _EtforgeRecipeBase(RecipeType):
    """Recipe types of the ``etforge`` backend (members made from the plugin registry)."""

    @classmethod
    def get_backend_name(cls) -> str:
        return BACKEND


def member_name(target: str) -> str:
    """``imxrt700cm`` -> ``IMXRT700CM``, ``cortex-m33`` -> ``CORTEX_M33``."""
    return "".join(c if c.isalnum() else "_" for c in target).upper()


_TYPES: dict[tuple[str, ...], Any] = {}


def recipe_types() -> Any:
    """The recipe-type enum of the current plugin registry: one member per registered target,
    its value the target's name (no hard-coded list; a plugin's target has its member)."""
    names = tuple(sorted(registry().targets))
    if names not in _TYPES:
        _TYPES[names] = _EtforgeRecipeBase("EtforgeRecipeType", [(member_name(n), n) for n in names])
    return _TYPES[names]


#: The recipe types of the installed plugins (entry points), as of importing this module.
EtforgeRecipeType = recipe_types()


class EtforgeRecipeProvider(BackendRecipeProvider):
    """ExecuTorch's recipe provider for etforge's targets."""

    @property
    def backend_name(self) -> str:
        return BACKEND

    def get_supported_recipes(self) -> Sequence[RecipeType]:
        return list(recipe_types())

    def create_recipe(self, recipe_type: RecipeType, **kwargs: Any) -> ExportRecipe | None:
        if not isinstance(recipe_type, _EtforgeRecipeBase):
            return None
        return target_recipe(str(recipe_type.value), **kwargs)  # a target no longer registered: named


@_quiet
def target_recipe(
    target: str = "imxrt700cm",
    *,
    calibration: Sequence[Sequence[torch.Tensor]] | Callable[[], Iterable[tuple[Any, ...]]] | None = None,
    train_fn: Callable[[torch.fx.GraphModule], None] | None = None,
    memory_budget: int | None = None,
    dynamic_batch_size: bool = False,
    lowering: str = "early",
    **options: Any,
) -> ExportRecipe:
    """The recipe for ``target`` (``etforge targets``); ``options``: the target's options.

    ``calibration``: batches (or a function returning them) for post-training quantization;
    by default ExecuTorch calibrates on every example input given to ``export``.
    ``train_fn(prepared)``: quantization-aware training instead (``docs/qat.md``).
    ``memory_budget`` (bytes): the planned arena must fit it, as ``etforge compile --memory-budget``.
    ``lowering``: ``"early"`` (``etforge compile``'s program) or ``"classic"`` (a script's,
    ``etforge.compile(..., lowering="classic")``). An unknown target or option is refused
    naming the known ones.
    """
    tgt = make_target(target, **options)  # unknown target / option: one line naming the known ones
    if lowering not in ("early", "classic"):
        raise EtforgeError(f"lowering must be 'early' or 'classic', not {lowering!r}")
    if memory_budget is not None and (not isinstance(memory_budget, int) or memory_budget < 1):
        raise EtforgeError(f"memory_budget must be a positive number of bytes, not {memory_budget!r}")
    qat = train_fn is not None
    quantizer = tgt.quantizer(qat=qat)
    calib_fn = None
    if calibration is not None and not qat:
        calib_fn = calibration if callable(calibration) else _batches(calibration)
    quant = QuantizationRecipe(
        quantizers=[quantizer],
        is_qat=qat,
        train_fn=train_fn,
        calibration_inputs_fn=calib_fn,
        dynamic_batch_size=dynamic_batch_size,
        pre_prepare_passes=[_Adapt(tgt, qat)],
    )
    aten_passes: list[Any] = [_ExportAdapted(tgt)]
    if lowering == "early":
        aten_passes.append(_DelegateEarly(tgt))
    lower = LoweringRecipe(
        partitioners=tgt.partitioners(),
        edge_compile_config=tgt.compile_config(),
        edge_manager_transform_passes=[_LowerCpu(tgt)],
    )
    return ExportRecipe(
        name=f"etforge-{target}" + ("-qat" if qat else ""),
        quantization_recipe=quant,
        aten_transform_passes=aten_passes,
        lowering_recipe=lower,
        executorch_backend_config=ExecutorchBackendConfig(memory_planning_pass=_planning(memory_budget)),
        pipeline_stages=list(PIPELINE),
        strict=False,
    )


def _batches(calibration: Sequence[Sequence[torch.Tensor]]) -> Callable[[], list[tuple[Any, ...]]]:
    batches = [tuple(b) for b in calibration]
    return lambda: batches


class _Adapt:
    """``pre_prepare`` pass: the captured graph in the target's memory format (``Target.adapt``).

    ExecuTorch's QUANTIZE stage captures the model with the caller's (NCHW) inputs; a
    script adapts the model before export, so this re-exports the captured graph the same
    way (a no-op where the target keeps NCHW). For post-training quantization a model
    captured in training mode is refused: ExecuTorch's stage calibrates it as it is, with
    dropout dropping and batch norm normalizing each batch by itself."""

    def __init__(self, tgt: Target, qat: bool) -> None:
        self.tgt, self.qat = tgt, qat

    @_quiet
    def __call__(self, gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
        if not self.qat:
            _refuse_training_mode(gm)
        example = tuple(_example_like(n.meta["val"]) for n in gm.graph.find_nodes(op="placeholder"))
        adapted, inputs, _ = self.tgt.adapt(gm, example)
        if adapted is gm and all(a is b for a, b in zip(inputs, example, strict=True)):
            return gm
        return torch.export.export(adapted, inputs, strict=False).module(check_guards=False)

    def __repr__(self) -> str:
        return f"etforge.adapt({self.tgt.name})"


#: ATen ops captured in training mode, and the position of their ``training`` argument.
_TRAINING_ARG = {"aten.batch_norm.default": 5, "aten.dropout.default": 2, "aten.feature_dropout.default": 2}


def _refuse_training_mode(gm: torch.fx.GraphModule) -> None:
    """(ExecuTorch's stage re-raises it as ``RuntimeError("QuantizeStage: Pass ... raised an
    error: <this line>")``, the etforge error its cause.)"""
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        position = _TRAINING_ARG.get(str(node.target))
        if position is not None and len(node.args) > position and node.args[position] is True:
            raise EtforgeError(
                f"the model was captured in training mode ({node.name}: {node.target}): call "
                "model.eval() before executorch.export.export, or give the recipe train_fn= for "
                "quantization-aware training"
            )


class _ExportAdapted:
    """``aten_transform`` pass: the quantized program exported with inputs in the target's layout.

    TORCH_EXPORT exports with the caller's inputs; on a channels-last target the program
    must take channels-last inputs, as ``etforge compile``'s does."""

    def __init__(self, tgt: Target) -> None:
        self.tgt = tgt

    @_quiet
    def __call__(self, method: str, ep: ExportedProgram) -> ExportedProgram:
        gm = ep.module(check_guards=False)
        users = set(ep.graph_signature.user_inputs)
        example = tuple(
            _example_like(n.meta["val"]) for n in ep.graph.find_nodes(op="placeholder") if n.name in users
        )
        adapted, inputs, _ = self.tgt.adapt(gm, example)
        if adapted is gm and all(a is b for a, b in zip(inputs, example, strict=True)):
            return ep
        return torch.export.export(adapted, inputs, strict=False)


class _DelegateEarly:
    """``aten_transform`` pass: NPU partitions delegated on the quantized ATen program.

    ``etforge compile``'s early lowering (``core.lower.driver.delegate_early``): the partitions
    are cut before ``to_edge``, and TO_EDGE_TRANSFORM_AND_LOWER lowers the rest, where the
    partitioner finds nothing more to take. Where the early path cannot be exact the
    program goes on whole and the stage delegates the classic way, as ``etforge compile``
    falls back (a warning says why)."""

    def __init__(self, tgt: Target) -> None:
        self.tgt = tgt

    @_quiet
    def __call__(self, method: str, ep: ExportedProgram) -> ExportedProgram:
        from etforge.core.lower.driver import delegate_early

        delegated, why = delegate_early(ep, self.tgt.spec, self.tgt._options())
        if delegated is None:
            if self.tgt.spec.npu is not None:
                warnings.warn(
                    f"etforge recipe ({self.tgt.name}): lowered the classic way: {why}", stacklevel=2
                )
            return ep
        return delegated


class _LowerCpu:
    """``edge_manager_transform`` pass: the CPU backend's lowering (``Target.lower_cpu``).

    The CPU backend rewrites the program (new kernels, their constants), which is no graph
    pass: the lowered program takes the method's place in the stage's program manager, and
    no further passes are returned."""

    def __init__(self, tgt: Target) -> None:
        self.tgt = tgt

    def __call__(self, edge: EdgeProgramManager) -> list[Any]:
        lowered = self.tgt.lower_cpu(edge)
        for method in edge.methods:
            edge._edge_programs[method] = lowered.exported_program(method)
        return []


def _planning(memory_budget: int | None) -> Any:
    """etforge's memory planning (``core.serialize.memory_plan``), checked against ``memory_budget``."""
    from etforge.core.serialize.memory_plan import planning_pass

    planner = planning_pass()
    if memory_budget is None:
        return planner

    class BudgetedPlanning(type(planner)):  # type: ignore[misc]
        def run(self, graph_module: torch.fx.GraphModule, graph_signature: Any = None) -> Any:
            result = super().run(graph_module, graph_signature)
            _check_budget(graph_module, memory_budget)
            return result

    budgeted = BudgetedPlanning.__new__(BudgetedPlanning)
    budgeted.__dict__.update(planner.__dict__)
    return budgeted


def _check_budget(gm: torch.fx.GraphModule, budget: int) -> None:
    """The arena just planned, and beside it each NPU partition's working memory, within
    ``budget`` (``etforge compile --memory-budget``'s two checks, worded the same)."""
    from etforge.core.litert import payload
    from etforge.core.serialize.npu_memory import plan_partitions

    arena = sum(int(b) for b in gm.meta.get("non_const_buffer_sizes", [0])[1:])
    if arena > budget:
        raise EtforgeError(f"planned arena {arena:,} B does not fit the memory budget {budget:,} B")
    parts = []
    for node in gm.graph.find_nodes(op="get_attr"):
        lowered = getattr(gm, str(node.target), None)
        if hasattr(lowered, "processed_bytes"):
            blob = payload.unpack_for_host(bytes(lowered.processed_bytes))
            if blob.format.startswith("litert"):
                parts.append((blob.partition, blob.data))
    for part in sorted(plan_partitions(parts), key=lambda p: (-p.working_bytes, p.name)):
        if arena + part.working_bytes > budget:
            raise EtforgeError(
                f"NPU partition {part.name}: working memory {part.working_bytes:,} B beside the planned "
                f"arena {arena:,} B ({arena + part.working_bytes:,} B) does not fit the memory budget "
                f"{budget:,} B ({part.source})"
            )


recipe_registry.register_backend_recipe_provider(EtforgeRecipeProvider())
