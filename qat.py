"""Quantization-aware training for a target: prepare, train with your own loop, compile.

``prepare`` captures the model in the target's memory format and inserts the fake-quantize
modules of the target's composed quantizer (``Target.quantizer(qat=True)``: the same rules as
post-training quantization, int8, fake-quantizing in training); ``compile`` converts the
trained module and lowers it the way ``etforge.compile`` lowers a quantized program. The
result verifies like any compile (``Compiled.verify``, ``etforge verify OUT --data``).

The prepared module remembers the target and options it was prepared for: compiling it for
another target is refused (its fake-quantize placement and specs are that target's), and so
is compiling it still in training mode (``prepared.eval()`` first: batch norm and dropout
take their inference form).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from etforge.api import Compiled, _quiet
from etforge.api import target as make_target
from etforge.core.common.errors import EtforgeError

#: ``GraphModule.meta`` key of what a module was prepared for: {"target": ..., "options": ...}.
PREPARED_KEY = "etforge_qat"
#: torchao's flag of an exported module's mode (``move_exported_model_to_train`` / ``_eval``).
_TRAINING_ATTR = "_exported_training"


@_quiet
def prepare(
    model: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    target: str = "imxrt700cm",
    **options: Any,
) -> torch.fx.GraphModule:
    """``model`` captured for ``target`` with fake quantization, in training mode.

    Train it with your own loop (its ``parameters()`` are the model's); ``prepared.eval()``
    before compiling. The caller's ``model`` is left as it was (a copy is captured). On the
    targets' CPU part the CPU backend's quantizer (CMSIS-NN's) has PTQ observers only: the
    nodes it annotates are observed in training, not fake-quantized (``qat_coverage``).
    """
    from torchao.quantization.pt2e import allow_exported_model_train_eval, move_exported_model_to_train
    from torchao.quantization.pt2e.quantize_pt2e import prepare_qat_pt2e

    from etforge.core.front.load import check_inputs, check_weights

    tgt = make_target(target, **options)
    what = type(model).__name__
    check_weights(dict(model.state_dict()), what)
    example = tuple(example_inputs)
    check_inputs(example, f"{what}: example input")
    adapted, inputs, _ = tgt.adapt(copy.deepcopy(model), example)
    adapted.train()  # batch norm and dropout captured in their training form
    try:
        captured = torch.export.export(adapted, inputs, strict=False).module(check_guards=False)
    except Exception as exc:
        hint = ""
        if "more than 1 value per channel when training" in str(exc):
            hint = " (batch norm is captured in training mode: give a training batch, 2 or more samples, as example)"
        raise EtforgeError(f"torch.export rejected {what}: {type(exc).__name__}: {exc}{hint}") from None
    prepared = prepare_qat_pt2e(captured, tgt.quantizer(qat=True))
    allow_exported_model_train_eval(prepared)
    move_exported_model_to_train(prepared)
    prepared.meta[PREPARED_KEY] = {"target": target, "options": dict(options), "model": what}
    return prepared


def qat_coverage(prepared: torch.fx.GraphModule) -> tuple[int, int]:
    """(fake-quantize modules, observer-only modules) in ``prepared``: what training sees.

    Biases (derived from their input's and weight's scales) count as neither."""
    from torchao.quantization.pt2e import DerivedObserverOrFakeQuantize
    from torchao.quantization.pt2e.fake_quantize import FakeQuantizeBase
    from torchao.quantization.pt2e.observer import ObserverBase

    fq = [m for m in prepared.modules() if isinstance(m, FakeQuantizeBase)]
    inner = {id(getattr(m, "activation_post_process", None)) for m in fq}
    observers = [
        m
        for m in prepared.modules()
        if isinstance(m, ObserverBase)
        and not isinstance(m, DerivedObserverOrFakeQuantize)
        and id(m) not in inner
    ]
    return len(fq), len(observers)


@_quiet
def compile(  # noqa: A001 (as etforge.compile)
    prepared: torch.fx.GraphModule,
    example_inputs: Sequence[torch.Tensor],
    target: str | None = None,
    lowering: str = "early",
) -> Compiled:
    """Convert the trained ``prepared`` module and lower it for its target (``target``: must
    be the one it was prepared for). ``prepared`` itself is not changed."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

    info = (
        getattr(prepared, "meta", {}).get(PREPARED_KEY)
        if isinstance(prepared, torch.fx.GraphModule)
        else None
    )
    if info is None:
        raise EtforgeError(
            f"{type(prepared).__name__} was not prepared by etforge.qat.prepare: prepare the float model "
            "for a target, train it, then compile it (docs/qat.md)"
        )
    if target is not None and target != info["target"]:
        raise EtforgeError(
            f"{info['model']} was prepared for QAT on {info['target']!r}, not {target!r}: its fake "
            f"quantization follows {info['target']}'s rules; prepare the float model for {target!r} "
            "and train again, or compile for the target it was prepared for"
        )
    if getattr(prepared, _TRAINING_ATTR, False):
        raise EtforgeError(
            f"{info['model']} is in training mode (batch norm and dropout in their training form): "
            "call prepared.eval() before etforge.qat.compile"
        )
    if lowering not in ("early", "classic"):
        raise EtforgeError(f"lowering must be 'early' or 'classic', not {lowering!r}")
    tgt = make_target(info["target"], **info["options"])
    _, inputs, _ = tgt.adapt(torch.nn.Module(), tuple(example_inputs))
    trained = copy.deepcopy(prepared)
    float_ep = torch.export.export(_without_fake_quant(trained), inputs, strict=False)
    quantized = torch.export.export(convert_pt2e(copy.deepcopy(prepared)), inputs, strict=False)
    return _lower(quantized, float_ep, tgt, info["model"], early=lowering == "early")


def _without_fake_quant(prepared: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """The trained float model: ``prepared`` (a private copy) with its fake-quantize and
    observer modules taken out of the graph (each passes its input through)."""
    from torchao.quantization.pt2e.fake_quantize import FakeQuantizeBase
    from torchao.quantization.pt2e.observer import ObserverBase

    graph = prepared.graph
    for node in list(graph.find_nodes(op="call_module")):
        module = prepared.get_submodule(str(node.target))
        if isinstance(module, FakeQuantizeBase | ObserverBase):
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
    prepared.delete_all_unused_submodules()
    prepared.recompile()
    return prepared


def _lower(quantized: Any, float_ep: Any, tgt: Any, what: str, early: bool) -> Compiled:
    """The quantized program lowered and serialized as ``etforge.compile`` does it."""
    from executorch.exir.passes.remove_unused_parameters_pass import remove_unused_parameters_pass

    from etforge.core.build.report import build_report
    from etforge.core.build.session import CompileSession
    from etforge.core.registry.manager import registry
    from etforge.runtime.verification.script_pte import _serialized

    reg = registry()
    quantized = remove_unused_parameters_pass(quantized)
    session = CompileSession(tgt.spec, reg=reg, options=tgt._options(), early=early)
    built = session.lower(quantized, quantized)
    result = session.result(float_ep, built, _serialized(built.edge), notes=["quantization-aware training"])
    return Compiled(result, build_report(result, reg, what))
