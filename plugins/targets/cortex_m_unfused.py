"""A clamp-like activation ExecuTorch's Cortex-M lowering could not fuse keeps its producer quantized.

PT2E quantizes ``conv -> relu`` as one pattern: no quantize between them, so the conv's
output has no qparams of its own. ``ActivationFusionPass`` then folds the ReLU into the
conv's output range, which it can only do when the ReLU's zero point is the range's low end.
When the ReLU's output shares its qparams with another tensor (a U-Net skip into a ``cat``
whose other input goes negative), the zero point is higher, the fusion is refused with a
log line, and the conv keeps no output qparams: ``AtenToCortexMPass`` leaves it an
``aten.convolution`` on int8 values, which the portable kernel computes as if they were
numbers (a silent miscompile, 200 steps off). Here such a producer gets its activation's
output qparams; the activation stays and clamps the int8 values at its quantized bounds
(``QuantizedClampActivationPass``). That is exact: quantization is monotone, so clamping
before it or after it at the quantized bounds gives the same int8 value.
"""

from __future__ import annotations

import copy
import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from executorch.exir.pass_base import ExportPass


@functools.cache
def unfused_activation_pass() -> type[ExportPass]:
    """The pass class (built once, on first use: it imports ExecuTorch)."""
    from executorch.exir.dialects._ops import ops as exir_ops
    from executorch.exir.pass_base import ExportPass
    from torch.fx import GraphModule
    from torch.fx.passes.infra.pass_manager import PassResult

    edge = exir_ops.edge.aten
    producers = {edge.convolution.default, edge.linear.default, edge.add.Tensor, edge.sub.Tensor}
    clamps = {edge.relu.default, edge.hardtanh.default, edge.clamp.default}

    class KeepUnfusedProducersQuantized(ExportPass):
        """Give an unfused activation's producer the activation's output qparams; quantize the
        bounds of an unfused activation ``QuantizedClampActivationPass`` will not see."""

        def call(self, graph_module: GraphModule) -> Any:
            modified = False
            for node in graph_module.graph.nodes:
                if node.op == "call_function" and node.target in clamps and _clamp_on_codes(node):
                    modified = True
                    continue
                if node.op != "call_function" or node.target not in producers:
                    continue
                if not node.meta.get("input_qparams") or node.meta.get("output_qparams"):
                    continue
                users = list(node.users)
                if len(users) != 1 or users[0].op != "call_function" or users[0].target not in clamps:
                    continue
                out = users[0].meta.get("output_qparams") or {}
                if 0 in out:
                    node.meta["output_qparams"] = {0: copy.copy(out[0])}
                    modified = True
            return PassResult(graph_module, modified)

    return KeepUnfusedProducersQuantized


def _clamp_on_codes(node: Any) -> bool:
    """An unfused clamp-like activation on int8 values whose producer still looks float to
    ``QuantizedClampActivationPass`` (it reads the producer's traced dtype: an SE gate's
    ``x * sigmoid(g)`` behind a layout copy), which then leaves float bounds clamping int8
    codes (rexnet's ReLU6: 115 steps off). Folded q/dq (``input_qparams``) are what make the
    input int8; with equal in/out qparams the clamp at the quantized bounds is exact. Rewritten
    to ``aten.clamp`` with those bounds, as that pass does."""
    import torch
    from executorch.backends.arm._passes.arm_pass_utils import get_first_fake_tensor
    from executorch.backends.cortex_m.passes.passes_utils import get_activation_bounds, quantize_val
    from executorch.exir.dialects._ops import ops as exir_ops

    given, out = node.meta.get("input_qparams") or {}, node.meta.get("output_qparams") or {}
    if 0 not in given or 0 not in out or given[0] != out[0]:
        return False
    q = out[0]
    if q.per_channel or not isinstance(q.scale, float) or not isinstance(q.zp, int):
        return False
    try:
        if get_first_fake_tensor(node.args[0]).dtype == torch.int8:
            return False  # QuantizedClampActivationPass's own case
    except Exception:  # noqa: BLE001  (no traced value: leave it to that pass, as it would)
        return False
    bounds = get_activation_bounds(node)
    if bounds is None:
        return False
    low, high = (None if v is None else int(quantize_val(v, q.scale, q.zp, q.qmin, q.qmax)) for v in bounds)
    node.target = exir_ops.edge.aten.clamp.default
    node.args, node.kwargs = (node.args[0], low, high), {}
    return True


def with_unfused_activations(passes: list[Any]) -> list[Any]:
    """``passes`` with the pass right after ``ActivationFusionPass`` (unchanged without one)."""
    names = [getattr(p, "__name__", "") for p in passes]
    if "ActivationFusionPass" not in names:
        return passes
    at = names.index("ActivationFusionPass") + 1
    return [*passes[:at], unfused_activation_pass(), *passes[at:]]
