"""The whole quantized program simulated in the device's arithmetic (not teacher-forced).

The PT2E quantized program runs with every int8 value that has a device-exact rule
(``runtime.device_ref``) replaced by that rule's value computed from the simulation's own
earlier values: the chain of device references, end to end. ``verify`` requires the compiled
program's outputs (LiteRT reference kernels, the device's) to equal it — exact when every op
has a rule, else within ``SIM_MAX_STEPS`` — so a program whose output is far off the device's
arithmetic (a miscompiled CPU op, 255 steps off) fails even when its arg-max agrees.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from etforge.core.graph_utils import is_quantize, node_op

#: Output steps the compiled program may be from the simulation while some op has no
#: device-exact rule (listed): that op's one-step rounding differences are amplified by the
#: layers after it — up to ~23 steps on a random-weight MobileNetV2-96 with every op within one
#: step. 64 is under a third of a miscompile's 255 and above that amplification. With every op
#: exact the bound is 0.
SIM_MAX_STEPS = 64


@dataclass
class Simulation:
    outputs: list[Any]
    #: quantize nodes computed by torch for want of a device-exact rule: node -> reason
    not_exact: dict[str, str] = field(default_factory=dict)
    #: what the module returned, structured as ``forward`` returns it (``runtime.outputs.flatten``)
    raw: Any = None


def simulate(module: torch.fx.GraphModule, inputs: Sequence[torch.Tensor]) -> Simulation:
    """Run the PT2E program ``module`` with device-exact int8 values wherever a rule exists."""
    from etforge.runtime.device_ref import NotExact, Reference

    not_exact: dict[str, str] = {}

    class Device(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            out = super().run_node(n)
            if not is_quantize(n) or "per_tensor" not in node_op(n) or not isinstance(out, torch.Tensor):
                return out
            src = n.args[0]
            if not isinstance(src, torch.fx.Node) or src.op == "placeholder":
                return out  # the program's input quantization: the same on both sides
            try:
                return Reference(lambda a: self.env[a])(n).reshape(out.shape)
            except NotExact as why:
                not_exact[n.name] = str(why)
                return out

    with torch.no_grad():
        out = Device(module, garbage_collect_values=False).run(*inputs)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    return Simulation(outs, not_exact, raw=out)


def output_steps(ours: torch.Tensor, sim: torch.Tensor, scale: float) -> float:
    """Largest distance, in output quantization steps, of ``ours`` from the simulation."""
    if ours.shape != sim.shape:
        return float("inf")
    return float((ours.double() - sim.double()).abs().max()) / scale if ours.numel() else 0.0
