"""Post-training quantization: the target's NPU rules stacked over its CPU backend's quantizer,
calibrated once, converted straight to an ``ExportedProgram``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.export import ExportedProgram

from etforge.core.common import fallbacks
from etforge.core.common.errors import EtforgeError
from etforge.core.contracts.target import TargetSpec
from etforge.core.front.load import non_finite_count
from etforge.core.graph.utils import node_op
from etforge.core.quantize.quantizer import ComposedQuantizer, calibrate, convert, prepare
from etforge.core.registry.manager import Registry, registry


def quantizer_for(
    target: TargetSpec,
    options: dict[str, Any] | None = None,
    reg: Registry | None = None,
    is_qat: bool = False,
) -> Any:
    """The target's NPU rules first, then its CPU backend's quantizer for what they left.

    ``is_qat``: fake-quantize specs, for ``prepare_qat_pt2e``: the rules' own, and the CPU
    backend's quantizer's scheme with fake quantization (``core.quantize.qat_specs``).
    """
    reg = reg or registry()
    options = {**target.option_defaults(), **(options or {})}
    rules = reg.rules_for(target)
    # An op kept off the NPU is quantized the CPU's way (CMSIS-NN's linear takes per-tensor
    # weights, not the NPU rule's per-channel ones).
    blocked = set(options.get("operators_not_to_delegate", ()))
    keep = (lambda node: node_op(node) not in blocked) if blocked else None
    ours = ComposedQuantizer(rules, is_qat=is_qat, node_filter=keep) if rules else None
    cpu_q = reg.cpu_backend(target).quantizer(target, options)
    if is_qat and cpu_q is not None:
        from etforge.core.quantize.qat_specs import FakeQuantizing

        cpu_q = FakeQuantizing(cpu_q)
    if ours is None and cpu_q is None:
        raise EtforgeError(f"target {target.name!r} composes no quantizer (no rules, no CPU quantizer)")
    if ours is None:
        return cpu_q
    if cpu_q is None:
        return ours
    return StackedQuantizer(ours, cpu_q)


class StackedQuantizer(ComposedQuantizer.__mro__[1]):  # torchao's Quantizer base
    """``first`` annotates; ``fill`` annotates only the nodes ``first`` left alone.

    (torchao's ComposableQuantizer refuses a later quantizer touching earlier annotations;
    here the NPU rules own their nodes and the CPU quantizer fills the gaps.)
    """

    def __init__(self, first: Any, fill: Any) -> None:
        super().__init__()
        self.first, self.fill = first, fill

    def transform_for_annotation(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        return self.fill.transform_for_annotation(self.first.transform_for_annotation(model))

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        key = "quantization_annotation"
        self.first.annotate(model)
        owned = {n: n.meta.pop(key) for n in list(model.graph.nodes) if key in n.meta}
        self.fill.annotate(model)
        for node, ann in owned.items():
            node.meta[key] = ann
        _share_across(model, set(owned))
        return model

    def validate(self, model: torch.fx.GraphModule) -> None:
        return None


def _share_across(model: torch.fx.GraphModule, owned: set[torch.fx.Node]) -> None:
    """One observer per tensor where the two quantizers meet.

    A producer annotated by one quantizer and a consumer by the other would each observe the
    same tensor (quantize, dequantize, quantize again: a CPU requantization and its rounding
    at every NPU/CPU boundary, the model input and output included); so would a consumer of
    a shared-quantization op (a layout copy, a pool) whose group the other quantizer
    observes. The consumer takes the producer's quantization instead.
    """
    from torchao.quantization.pt2e.quantizer import QuantizationSpec, SharedQuantizationSpec

    key = "quantization_annotation"
    for node in model.graph.nodes:
        ann = node.meta.get(key)
        if ann is None:
            continue
        for src, spec in list(ann.input_qspec_map.items()):
            src_ann = src.meta.get(key) if isinstance(src, torch.fx.Node) else None
            if (
                src_ann is not None
                and src_ann.output_qspec is not None
                and (
                    (src in owned) != (node in owned)
                    or isinstance(src_ann.output_qspec, SharedQuantizationSpec)
                )
                and type(spec) is QuantizationSpec
                # a consumer asking for its own scheme (symmetric bmm inputs) keeps it: requantized
                and spec.qscheme == torch.per_tensor_affine
                and getattr(src_ann.output_qspec, "dtype", spec.dtype) == spec.dtype
            ):
                ann.input_qspec_map[src] = SharedQuantizationSpec(src)


def quantize(
    ep: ExportedProgram,
    target: TargetSpec,
    calibration: Sequence[Sequence[torch.Tensor]],
    reg: Registry | None = None,
    options: dict[str, Any] | None = None,
    observed: list[Any] | None = None,
) -> ExportedProgram:
    """PT2E post-training quantization with the target's composed quantizer; ``observed``
    gets the observed model's output on the first calibration batch.

    The converted graph becomes an ``ExportedProgram`` directly (``core/program_from_graph``:
    the program a re-export gives, without re-tracing); what that cannot take is re-exported,
    a recorded fallback.
    """
    from executorch.exir.passes.remove_unused_parameters_pass import remove_unused_parameters_pass

    from etforge.core.graph.program import Unsupported, program_from_graph

    example = tuple(ep.example_inputs[0])
    gm = prepare(ep.module(check_guards=False), quantizer_for(target, options, reg))
    try:  # an observer meets a NaN at calibration (histogram) or at convert (min/max)
        first = calibrate(gm, calibration)
        gm = convert(gm)
    except Exception as exc:
        culprit = non_finite(ep, calibration)
        if culprit is None:
            raise
        raise EtforgeError(
            f"calibration sample {culprit[0]}: {culprit[1]} ({culprit[2]}) computes NaN or infinite "
            "values in float (a square root or log of a negative, a division by zero, an overflow); "
            "int8 has no code for them, so nothing can be quantized: fix the model or its "
            "calibration inputs"
        ) from exc
    if observed is not None:
        observed.append(first)
    try:
        quantized = program_from_graph(gm, ep, example)
    except Unsupported as exc:
        fallbacks.record(
            "quantize", "re-exported the quantized program with torch.export (slower)", "", str(exc)
        )
        quantized = torch.export.export(gm, example, strict=False)
    # The float weights PT2E folded into int8 constants stay in the graph module's state,
    # unused; to_edge would drop them (its first pass), here they leave before anything
    # copies or writes the program.
    return remove_unused_parameters_pass(quantized)


def non_finite(ep: ExportedProgram, batches: Sequence[Sequence[torch.Tensor]]) -> tuple[int, str, str] | None:
    """(sample, node, op) of the first float op computing a NaN or infinity on ``batches``:
    observers fail on them with torch's words (``histc``, ``min nan``), not the model's."""
    found: list[tuple[str, str]] = []

    class Watch(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            out = super().run_node(n)
            if (
                not found
                and n.op == "call_function"
                and isinstance(out, torch.Tensor)
                and non_finite_count(out)
            ):
                found.append((n.name, node_op(n)))
            return out

    gm = ep.module(check_guards=False)
    with torch.no_grad():
        for index, batch in enumerate(batches):
            Watch(gm).run(*batch)
            if found:
                return index, *found[0]
    return None
