"""The PT2E quantized program evaluated in float64: how precise the reference itself is.

torch runs the quantized reference in float32: dequantized values are rounded again, and
a convolution sums thousands of float32 products, so a value near a rounding boundary of
the next quantize can land on either side. An int8 kernel accumulates exactly, so it is
not closer to that float32 evaluation than the evaluation is to the program's exact value.
Evaluated here in float64 (quantize and dequantize included), the program is exact to
~1e-16: ``verify`` counts top-1 agreement against that value, and reports (never gates on)
how far torch's float32 evaluation lies from it. On random-weight BatchNorm nets (the zoo)
that distance is large: such nets amplify a one-step difference layer after layer; a gate
that widened with it would loosen itself exactly where the model is most sensitive.
A conv or linear of int8 values is summed as integers where float32 holds every partial sum
exactly (``runtime.verification.exact_sums``): the same value to float64 rounding, far faster.
"""

from __future__ import annotations

from typing import Any

import torch

from etforge.core.graph.utils import op_name
from etforge.runtime.verification.constant_nodes import ConstantNodes
from etforge.runtime.verification.exact_sums import DEFERRED, Sums, integer_sum, keep_codes


def _quantize(
    x: torch.Tensor, scale: Any, zero_point: Any, qmin: int, qmax: int, dtype: torch.dtype
) -> torch.Tensor:
    q = x.double() / scale  # then in place: the same IEEE operations, fewer fresh tensors
    q.round_()
    if not (isinstance(zero_point, (int, float)) and zero_point == 0):
        q.add_(zero_point)
    # out of place: torch.vmap has a batching rule for clamp, none for clamp_ with number bounds
    # (its fallback runs each sample alone and warns); the same IEEE values
    return q.clamp(qmin, qmax).to(dtype)


def _channel(v: Any, x: torch.Tensor, axis: int) -> Any:
    """A per-channel parameter shaped to broadcast along ``axis`` of ``x``."""
    if v is None:  # no zero points: symmetric
        return 0.0
    shape = [1] * x.dim()
    shape[axis] = -1
    return torch.as_tensor(v).double().reshape(shape)


def _per_tensor(v: Any) -> Any:
    return float(v) if isinstance(v, torch.Tensor) else v


class Float64(torch.fx.Interpreter):
    """Runs a quantized GraphModule with every float in float64 and exact (de)quantization;
    ``constants``: the values of nodes that read no input, kept from an earlier sample."""

    def __init__(
        self, module: torch.fx.GraphModule, constants: ConstantNodes | None = None, sums: Sums | None = None
    ) -> None:
        super().__init__(module)
        self.constants = constants
        self.sums = sums  # which convs / linears were summed as integers (``exact_sums``)
        self.codes: dict[torch.fx.Node, Any] = {}  # weight codes, without ``constants``
        self.deferrable = keep_codes(module.graph, self.user_to_last_uses)
        if constants is not None:
            self.deferrable -= constants.nodes

    def run_node(self, n: torch.fx.Node) -> Any:
        if self.constants is not None and n in self.constants.values:
            return self.constants.values[n]
        if n in self.deferrable:  # read only as a sum's input: its codes are what the sum reads
            held = self.env.get(n.args[0])  # type: ignore[arg-type]
            if isinstance(held, torch.Tensor) and not held.is_floating_point():
                return DEFERRED
        cache = self.constants.derived if self.constants is not None else self.codes
        out = integer_sum(n, self, cache, self.sums)  # a conv / linear of int8 values: integer sums
        if out is None:
            for a in n.all_input_nodes:  # a sum not taken after all: its input's value, computed now
                if self.env.get(a) is DEFERRED:
                    self.env[a] = super().run_node(a).double()
            out = super().run_node(n)
        if isinstance(out, torch.Tensor) and out.is_floating_point():
            out = out.double()
        if self.constants is not None:
            self.constants.keep(n, out)
        return out

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        if target is torch.ops.aten._assert_tensor_metadata.default:
            return None  # it checks a float32 dtype the float64 evaluation does not keep (edgenext)
        name = op_name(target).split(".")
        if name[0] != "quantized_decomposed" or len(name) < 2:
            return super().call_function(target, args, kwargs)
        op = name[1]
        x = args[0]
        if op == "quantize_per_tensor":
            scale, zp, qmin, qmax, dtype = args[1:6]
            return _quantize(x, _per_tensor(scale), _per_tensor(zp), qmin, qmax, dtype)
        if op == "dequantize_per_tensor":
            scale, zp = _per_tensor(args[1]), _per_tensor(args[2])
            return x.double().sub_(zp).mul_(scale) if x.dtype != torch.float64 else (x - zp) * scale
        if op == "quantize_per_channel":
            scales, zps, axis, qmin, qmax, dtype = args[1:7]
            return _quantize(x, _channel(scales, x, axis), _channel(zps, x, axis), qmin, qmax, dtype)
        if op == "dequantize_per_channel":
            scales, zps, axis = args[1:4]
            value = x.double() if x.dtype != torch.float64 else x.clone()
            return value.sub_(_channel(zps, x, axis)).mul_(_channel(scales, x, axis))
        return super().call_function(target, args, kwargs)


def run_float64(module: torch.fx.GraphModule, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """The program's outputs evaluated in float64 (floating outputs returned as float32)."""
    with torch.no_grad():
        out = Float64(module).run(*inputs)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    return [o.float() if isinstance(o, torch.Tensor) and o.is_floating_point() else o for o in outs]
