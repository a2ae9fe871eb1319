"""The whole quantized program simulated in the device's arithmetic (not teacher-forced).

The PT2E quantized program runs with every int8 value replaced by the value the kernel that
computes it on the device would produce from the simulation's own earlier values — the chain
of device references, end to end, each op by the rule of where it runs:

- an NPU op (inside a partition, or a partition's output): ``runtime.arithmetic.device_ref`` (TFLite's
  reference kernels, which the NPU compiler follows);
- a CPU library's op: its plugin's reference (``stepwise.library_rule``; a Cortex-M op's is
  CMSIS-NN's arithmetic);
- a portable op: dequantize, the float op, quantize — what torch computes for the program.

An op with no rule yet (listed as ``not_exact``) takes the compiled program's own value when
that is within ``FORCE_MAX_STEPS`` of torch's op on the simulation's inputs (the per-op gate's
rule for such ops), else torch's value. ``verify`` then requires the compiled program's outputs
(LiteRT reference kernels, the Cortex-M kernels: the device's arithmetic) to *equal* the
simulation, every value of every output; only when some unruled value could not be taken from
the program (``unforced``) is it within ``SIM_MAX_STEPS``. A program far off the device's
arithmetic (a miscompiled CPU op, 255 steps off) fails even when its arg-max agrees.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from etforge.core.graph.utils import is_quantize, node_op
from etforge.runtime.verification.constant_nodes import ConstantNodes
from etforge.runtime.verification.stepwise import PORTABLE, laid_out_as, library_rule

#: Steps an unruled op's simulated value may be from the compiled program's for the program's
#: value to be used: one rounding, the rule ``verify`` gates such ops with (``OP_MAX_STEPS``).
FORCE_MAX_STEPS = 1
#: Output steps the compiled program may be from the simulation when some op without a
#: device-exact rule has no recorded program value (``unforced``, listed; today: none on the
#: architecture and real-model suites): its value is torch's, one rounding off the device's,
#: and the layers after it may amplify that. 4 steps leaves room for a few such roundings
#: reaching an output through a short head and is 1/64 of a miscompile's 255; with every value
#: ruled or forced the bound is 0.
SIM_MAX_STEPS = 4

#: Where a quantize node's value is computed: the kernel kinds ``runtime.verification.stepwise`` records
#: (a CPU library's namespace, ``PORTABLE``); a value with no kind is an NPU partition's.
NPU = ""


@dataclass
class Simulation:
    outputs: list[Any]
    #: quantize nodes without a device-exact rule: node -> reason (their values: see module doc)
    not_exact: dict[str, str] = field(default_factory=dict)
    #: those of them whose value is torch's, not the compiled program's (bound ``SIM_MAX_STEPS``)
    unforced: dict[str, str] = field(default_factory=dict)
    #: what the module returned, structured as ``forward`` returns it (``runtime.verification.outputs.flatten``)
    raw: Any = None


def simulate(
    module: torch.fx.GraphModule,
    inputs: Sequence[torch.Tensor],
    kinds: Mapping[str, tuple[str, str]] | None = None,
    program_values: Mapping[str, torch.Tensor] | None = None,
    seen: dict[str, tuple[torch.Tensor | None, torch.Tensor]] | None = None,
    constants: ConstantNodes | None = None,
) -> Simulation:
    """Run the PT2E program ``module`` in the device's arithmetic.

    ``kinds``: quantize node -> (kernel kind, host op) for the values the host computes on the
    CPU (absent: an NPU value); ``program_values``: the compiled program's int8 values by
    quantize node, used for ops with no rule (see the module doc); ``seen`` (when given)
    collects, per per-tensor quantize node, (its rule's value, None without a rule; torch's
    value on the simulation's inputs): ``runtime.verification.exact_pass`` judges the ops from them;
    ``constants``: the values of nodes that read no input, kept from an earlier sample
    (``runtime.verification.constant_nodes``; quantize nodes are always computed, so ``seen`` is complete).
    """
    from etforge.runtime.arithmetic.device_ref import Reference
    from etforge.runtime.arithmetic.operands import NotExact

    kinds, program_values = kinds or {}, program_values or {}
    not_exact: dict[str, str] = {}
    unforced: dict[str, str] = {}

    class Device(torch.fx.Interpreter):
        def run_node(self, n: torch.fx.Node) -> Any:
            if constants is not None and n in constants.values:
                return constants.values[n]
            out = super().run_node(n)
            if constants is not None and not is_quantize(n):
                constants.keep(n, out)
            if not is_quantize(n) or "per_tensor" not in node_op(n) or not isinstance(out, torch.Tensor):
                return out
            kind, host_op = kinds.get(n.name, (NPU, ""))
            src = n.args[0]
            if kind == PORTABLE or (
                kind == NPU and (not isinstance(src, torch.fx.Node) or src.op == "placeholder")
            ):
                # the portable kernel's dequantize, float op, quantize: torch's; the program's
                # input quantization: the same on both sides
                if seen is not None:
                    seen[n.name] = (out, out)
                return out
            value = lambda a: self.env[a]  # noqa: E731
            try:
                rule = Reference(value) if kind == NPU else library_rule(kind, value, host_op)
                ruled = laid_out_as(rule(n), out)
                if seen is not None:
                    seen[n.name] = (ruled, out)
                return ruled
            except NotExact as why:
                if seen is not None:
                    seen[n.name] = (None, out)
                not_exact[n.name] = str(why)
                ours = program_values.get(n.name)
                if ours is not None and tuple(ours.shape) == tuple(out.shape):
                    off = (ours.to(torch.int32) - out.to(torch.int32)).abs()
                    if not off.numel() or int(off.max()) <= FORCE_MAX_STEPS:
                        return laid_out_as(ours, out)
                if not _copies_codes(n, self.env):
                    unforced[n.name] = str(why)
                return out

    with torch.no_grad():
        out = Device(module, garbage_collect_values=False).run(*inputs)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    return Simulation(outs, not_exact, unforced, raw=out)


def _copies_codes(q: torch.fx.Node, env: Mapping[torch.fx.Node, Any]) -> bool:
    """``q`` quantizes, on its input's grid, an op that returned its dequantized input unchanged
    (an eval-mode dropout, a clone): the device copies the codes, so torch's value is exact."""
    from etforge.core.graph.utils import is_dequantize

    op = q.args[0]
    src = op.args[0] if isinstance(op, torch.fx.Node) and op.args else None
    if (
        not isinstance(src, torch.fx.Node)
        or not is_dequantize(src)
        or tuple(src.args[1:3]) != tuple(q.args[1:3])
    ):
        return False
    a, b = env.get(op), env.get(src)
    return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)


def output_steps(ours: torch.Tensor, sim: torch.Tensor, scale: float) -> float:
    """Largest distance, in output quantization steps, of ``ours`` from the simulation."""
    if ours.shape != sim.shape:
        return float("inf")
    return float((ours.double() - sim.double()).abs().max()) / scale if ours.numel() else 0.0
