"""Compose one torchao PT2E quantizer from the quantizer-rule plugins a target selects.

int8 everywhere: per-channel symmetric weights, per-tensor affine activations, int32
biases with scale ``in_scale * w_scale``. Rules only say *which kind* an op is; the kinds
are implemented once here, so a rule never touches observers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e.fake_quantize import FakeQuantize, FusedMovingAvgObsFakeQuantize
from torchao.quantization.pt2e.observer import (
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    PerChannelMinMaxObserver,
)
from torchao.quantization.pt2e.quantizer import (
    DerivedQuantizationSpec,
    FixedQParamsQuantizationSpec,
    QuantizationAnnotation,
    QuantizationSpec,
    QuantizationSpecBase,
    Quantizer,
    SharedQuantizationSpec,
)

from etforge.core.common.threads import one_thread
from etforge.core.contracts.quant_rule import QuantRule
from etforge.core.graph.utils import node_op, tensor_meta

ANNOTATION_KEY = "quantization_annotation"
INT8_MIN, INT8_MAX = -128, 127


@dataclass(frozen=True)
class Specs:
    """The scheme's quantization specs, handed to custom rules."""

    activation: QuantizationSpec
    weight: Callable[[int], QuantizationSpec]
    is_qat: bool

    def bias(self, act_edge: tuple[Node, Node], weight_edge: tuple[Node, Node]) -> DerivedQuantizationSpec:
        def derive(obs: list[torch.nn.Module]) -> tuple[torch.Tensor, torch.Tensor]:
            a_scale, _ = obs[0].calculate_qparams()
            w_scale, _ = obs[1].calculate_qparams()
            scale = (a_scale * w_scale).to(torch.float32)
            return scale, torch.zeros_like(scale, dtype=torch.int32)

        return DerivedQuantizationSpec(
            derived_from=[act_edge, weight_edge],
            derive_qparams_fn=derive,
            dtype=torch.int32,
            quant_min=-(2**31),
            quant_max=2**31 - 1,
            qscheme=torch.per_channel_symmetric,
            ch_axis=0,
        )

    def fixed(self, scale: float, zero_point: int) -> FixedQParamsQuantizationSpec:
        return FixedQParamsQuantizationSpec(
            dtype=torch.int8,
            scale=scale,
            zero_point=zero_point,
            quant_min=INT8_MIN,
            quant_max=INT8_MAX,
            qscheme=torch.per_tensor_affine,
        )


def int8_specs(is_qat: bool = False) -> Specs:
    if is_qat:
        act_ctr = FusedMovingAvgObsFakeQuantize.with_args(observer=MovingAverageMinMaxObserver, eps=2**-12)
        w_ctr: Callable[[int], object] = lambda axis: FakeQuantize.with_args(  # noqa: E731
            observer=MovingAveragePerChannelMinMaxObserver, ch_axis=axis, eps=2**-12
        )
    else:
        act_ctr = MinMaxObserver.with_args(eps=2**-12)
        w_ctr = lambda axis: PerChannelMinMaxObserver.with_args(ch_axis=axis, eps=2**-12)  # noqa: E731
    act = QuantizationSpec(
        dtype=torch.int8,
        quant_min=INT8_MIN,
        quant_max=INT8_MAX,
        qscheme=torch.per_tensor_affine,
        observer_or_fake_quant_ctr=act_ctr,
    )

    def weight(axis: int) -> QuantizationSpec:
        return QuantizationSpec(
            dtype=torch.int8,
            quant_min=-127,
            quant_max=127,
            qscheme=torch.per_channel_symmetric,
            ch_axis=axis,
            observer_or_fake_quant_ctr=w_ctr(axis),
        )

    return Specs(act, weight, is_qat)


def _is_float_tensor(arg: object) -> bool:
    val = tensor_meta(arg)
    return val is not None and val.dtype.is_floating_point


def _annotated(node: Node) -> bool:
    ann = node.meta.get(ANNOTATION_KEY)
    return bool(ann is not None and ann._annotated)


def _mark(
    node: Node, inputs: dict[Node, QuantizationSpecBase | None], output: QuantizationSpecBase | None
) -> None:
    node.meta[ANNOTATION_KEY] = QuantizationAnnotation(
        input_qspec_map=inputs, output_qspec=output, _annotated=True
    )


def _fusable(rule: QuantRule, node: Node, rules: dict[str, QuantRule]) -> Node | None:
    """The activation that shares ``node``'s output observer, if the rule fuses it (and the
    activation's own rule, through ``fusable``, agrees for that node)."""
    if len(node.users) != 1:
        return None
    user = next(iter(node.users))
    if user.op != "call_function" or _annotated(user):
        return None
    name = node_op(user)
    if name not in rule.fuse:
        return None
    own = rules.get(name)
    if own is not None and own.fusable is not None and not own.fusable(user):
        return None
    return user


class ComposedQuantizer(Quantizer):
    """A PT2E quantizer built from :class:`QuantRule` plugins.

    ``node_filter`` restricts annotation (e.g. to the nodes bound for one processor);
    rules earlier in ``rules`` win for an op claimed twice.
    """

    def __init__(
        self,
        rules: Iterable[QuantRule],
        is_qat: bool = False,
        node_filter: Callable[[Node], bool] | None = None,
    ) -> None:
        super().__init__()
        self.rules: dict[str, QuantRule] = {}
        for rule in rules:
            for op in rule.ops:
                self.rules.setdefault(op, rule)
        self.specs = int8_specs(is_qat)
        self.node_filter = node_filter

    def annotate(self, model: GraphModule) -> GraphModule:
        for node in model.graph.nodes:
            if node.op != "call_function" or _annotated(node):
                continue
            rule = self.rules.get(node_op(node))
            if rule is None or (self.node_filter is not None and not self.node_filter(node)):
                continue
            self._apply(rule, node)
        return model

    def validate(self, model: GraphModule) -> None:
        return None

    # -- kinds -------------------------------------------------------------------------------
    def _inputs(self, rule: QuantRule, node: Node) -> list[Node]:
        flat: list[object] = []
        for i, a in enumerate(node.args):
            if rule.inputs is not None and i not in rule.inputs:
                continue
            flat.extend(a if isinstance(a, (list, tuple)) else [a])
        return [a for a in flat if isinstance(a, Node) and _is_float_tensor(a)]

    def _apply(self, rule: QuantRule, node: Node) -> None:
        s = self.specs
        if rule.kind == "custom":
            assert rule.annotate is not None
            rule.annotate(node, s)
            return
        if rule.kind == "weighted":
            self._weighted(rule, node)
            return
        inputs = self._inputs(rule, node)
        if not _is_float_tensor(node) and rule.kind != "shared":
            return
        if rule.kind == "io":
            _mark(node, {a: s.activation for a in inputs}, s.activation)
        elif rule.kind == "fixed":
            assert rule.fixed is not None
            _mark(node, {a: s.activation for a in inputs}, s.fixed(*rule.fixed))
        elif rule.kind == "shared":
            if not inputs:
                return
            first = inputs[0]
            shared = SharedQuantizationSpec((first, node))
            spec_map: dict[Node, QuantizationSpecBase | None] = {first: s.activation}
            spec_map.update({a: shared for a in inputs[1:]})
            _mark(node, spec_map, shared if _is_float_tensor(node) or tensor_meta(node) is None else None)
        self._fuse(rule, node)

    def _weighted(self, rule: QuantRule, node: Node) -> None:
        s = self.specs
        args = list(node.args) + [None] * 3
        act, weight, bias = args[0], args[1], args[2]
        if not (isinstance(act, Node) and isinstance(weight, Node)):
            return
        w_val, out_val = tensor_meta(weight), tensor_meta(node)
        if (
            rule.weight_axis != 0
            and w_val is not None
            and out_val is not None
            and len(out_val.shape) > 1
            and w_val.shape[rule.weight_axis] != out_val.shape[1]
        ):
            # a grouped transposed conv (the only weights with channels on axis 1): its weight
            # holds out/groups channels there, so per-channel scales cannot match the bias
            # (torch's quantize_per_channel fails); left float, the op runs on the CPU
            return
        spec_map: dict[Node, QuantizationSpecBase | None] = {
            act: s.activation,
            weight: s.weight(rule.weight_axis),
        }
        if isinstance(bias, Node):
            spec_map[bias] = s.bias((act, node), (weight, node))
        fused = _fusable(rule, node, self.rules)
        _mark(node, spec_map, None if fused is not None else s.activation)
        if fused is not None:
            _mark(fused, {}, s.activation)

    def _fuse(self, rule: QuantRule, node: Node) -> None:
        fused = _fusable(rule, node, self.rules)
        if fused is not None:
            ann = node.meta[ANNOTATION_KEY]
            out = ann.output_qspec
            ann.output_qspec = None
            _mark(fused, {}, out)


def prepare(model: GraphModule, quantizer: Quantizer, qat: bool = False) -> GraphModule:
    """prepare_pt2e / prepare_qat_pt2e (one place that knows torchao's entry points)."""
    from torchao.quantization.pt2e.quantize_pt2e import prepare_pt2e, prepare_qat_pt2e

    from etforge.core.quantize.conv_bn import fold_conv_batch_norms

    with one_thread():
        if qat:
            return prepare_qat_pt2e(model, quantizer)
        fold_conv_batch_norms(model)  # what prepare_pt2e does first, without its quadratic cost
        return prepare_pt2e(model, quantizer)


def calibrate(model: GraphModule, batches: Iterable[Sequence[torch.Tensor]]) -> Any:
    """Run the observed model on ``batches``; returns its output on the first batch (observers
    pass values through: the float model's output, ``core/build/equivalence``).

    An observer of a constant (a weight) sees it once.

    A min/max observer's state after one look at a tensor is its state after any number of
    looks at the same tensor, so from the second batch on the weight observers step aside
    (resnet18's 20 per-channel weight observers were a sixth of its calibration).
    """
    once = _constant_min_max_observers(model)
    first = None
    try:
        with torch.no_grad(), one_thread():  # the scales must not depend on the thread count
            for index, batch in enumerate(batches):
                output = model(*batch)
                if index == 0:
                    first = output
                    for observer in once:
                        observer.forward = _seen  # type: ignore[method-assign]  # this instance only
    finally:
        for observer in once:
            observer.__dict__.pop("forward", None)
    return first


def _seen(x: torch.Tensor) -> torch.Tensor:
    return x


def _constant_min_max_observers(model: GraphModule) -> list[torch.nn.Module]:
    """Min/max observers (running averages included) whose input depends on no model input."""
    varying: set[Node] = set()
    found = []
    for node in model.graph.nodes:
        if node.op == "placeholder" or any(i in varying for i in node.all_input_nodes):
            varying.add(node)
        elif node.op == "call_module" and node.all_input_nodes:
            module = model.get_submodule(str(node.target))
            if isinstance(module, MinMaxObserver | PerChannelMinMaxObserver):
                found.append(module)
    return found


def convert(model: GraphModule) -> GraphModule:
    """convert_pt2e, each observer's qparams computed once, a histogram observer's search
    with its bin scans on Python floats (``core/quantize/histogram``), and no dequantize
    computed by the constant folding that discards it (``core/quantize/constant_fold``).

    torchao asks an activation observer for its qparams again for every bias derived from
    it; a histogram observer's answer is a search (~7 ms each), and the same every time.
    """
    from torchao.quantization.pt2e.observer import ObserverBase
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e

    from etforge.core.quantize import histogram
    from etforge.core.quantize.constant_fold import skip_discarded_dequantize

    observers = [m for m in model.modules() if isinstance(m, ObserverBase)]
    for observer in observers:
        calculate = (
            functools.partial(histogram.calculate_qparams, observer)
            if histogram.ENABLED and histogram.exact_type(observer)
            else observer.calculate_qparams
        )
        observer.calculate_qparams = _computed_once(calculate)  # type: ignore[method-assign]
    try:
        with one_thread(), skip_discarded_dequantize():
            return convert_pt2e(model)
    finally:
        for observer in observers:
            observer.__dict__.pop("calculate_qparams", None)


def _computed_once(calculate: Callable[[], Any]) -> Callable[[], Any]:
    answer: list[Any] = []

    def cached() -> Any:
        if not answer:
            answer.append(calculate())
        if isinstance(answer[0], tuple):  # each caller its own tensors, as before
            return tuple(t.clone() if isinstance(t, torch.Tensor) else t for t in answer[0])
        return answer[0]

    return cached
