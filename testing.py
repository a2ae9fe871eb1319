"""A testing kit for op-plugin authors: prove a converter the way etforge proves its own.

``check_op`` runs export -> quantize (composed quantizer) -> partition -> convert -> LiteRT
and compares with the PT2E quantized torch reference (or the float model).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class OpCheck:
    """What ``check_op`` measured (kept for further assertions)."""

    max_steps: float
    mean_steps: float
    max_rel: float
    litert_ops: list[str]
    delegated: list[str]
    refused: dict[str, str]
    outputs: list[torch.Tensor] = field(default_factory=list)
    reference: list[torch.Tensor] = field(default_factory=list)


#: Absolute tolerance of the float form an int8 ``check_op`` also runs: float32 evaluation
#: order (a conv + add: ~2e-6 on unit-scale values) stays below it, a wrong constant does not
#: (tanh-approximate GELU for exact GELU: 5e-4).
FLOAT_FORM_ATOL = 1e-5
#: The float form's allowance relative to each output's largest magnitude: a long reduction's
#: rounding follows the sum's size, not the element's, and the summation order is the CPU's
#: (a 7280-term transposed conv reaching 27: 1.65e-5 apart on one CI machine, 0 on another).
#: 1e-5 of a unit-scale output is still 50x below the GELU error above.
FLOAT_FORM_SPAN_RTOL = 1e-5


class OpCheckError(AssertionError):
    pass


def _calibration(example: tuple[torch.Tensor, ...], n: int, seed: int) -> list[tuple[torch.Tensor, ...]]:
    """``n`` seeded inputs around the example's statistics; the example itself is held out (it
    is what ``check_op`` measures on: an input the observers saw would hide a range error)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        out.append(
            tuple(
                torch.randn(x.shape, generator=g) * _spread(x) + x.mean() if x.is_floating_point() else x
                for x in example
            )
        )
    return out


def _spread(x: torch.Tensor) -> torch.Tensor:
    """The example's standard deviation (its magnitude for a single value), at least 1e-3."""
    return (x.std() if x.numel() > 1 else x.abs().reshape(())).clamp(min=1e-3)


def _held_out(example: tuple[torch.Tensor, ...], calibration: list[tuple[torch.Tensor, ...]]) -> None:
    """Refuse a calibration set that holds the example: ``check_op`` measures on the example."""
    floats = [i for i, x in enumerate(example) if x.is_floating_point()]
    if floats and any(all(torch.equal(sample[i], example[i]) for i in floats) for sample in calibration):
        raise OpCheckError(
            "the example input is in the calibration set: check_op measures on the example, "
            "which must be an input the quantizer's observers did not see"
        )


@dataclass(frozen=True)
class OutputForm:
    """How one user output leaves the lowered program: the dequantize producing it (its op and
    scale) or None for a float output. It decides the tolerance ``check_op`` holds it to."""

    op: str | None
    scale: float | None

    def describe(self) -> str:
        if self.scale is None:
            why = "a float output" if self.op is None else f"from {self.op} with a tensor scale"
            return f"{why}: held to the float tolerance"
        return f"int8, dequantized by {self.op} (scale {self.scale:.4g}): held to max_steps"


def dequantize_forms(target: Any, reg: Any) -> frozenset[str]:
    """Every dequantize op a program for ``target`` may end in: ``quantized_decomposed``'s and
    those of the target's CPU backend (``CpuBackend.dequantize_ops``, e.g. CMSIS-NN's)."""
    from etforge.core.graph.utils import DEQUANTIZE_OPS

    backend = reg.cpu_backends.get(target.cpu_fallback)
    return DEQUANTIZE_OPS | frozenset(backend.dequantize_ops if backend is not None else ())


def _output_forms(edge_ep: Any, dequantize_ops: frozenset[str]) -> list[OutputForm]:
    """How each user output leaves the program (see :class:`OutputForm`)."""
    from etforge.core.graph.utils import node_op

    out_node = next(n for n in edge_ep.graph_module.graph.nodes if n.op == "output")
    forms: list[OutputForm] = []
    for a in out_node.args[0]:
        op = node_op(a) if getattr(a, "op", None) == "call_function" else None
        if op in dequantize_ops:
            scale = a.args[1]
            forms.append(OutputForm(op, float(scale) if isinstance(scale, (int, float)) else None))
        else:
            forms.append(OutputForm(None, None))
    return forms


def check_op(
    module: torch.nn.Module,
    example_inputs: Sequence[torch.Tensor],
    target: str = "litert",
    quantize: bool = True,
    max_steps: float = 1.0,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    calibration: Sequence[Sequence[torch.Tensor]] | None = None,
    expect_delegated: bool = True,
    options: dict[str, Any] | None = None,
    seed: int = 0,
    plugins: Sequence[object] = (),
    float_check: bool = True,
    span_rtol: float = 0.0,
) -> OpCheck:
    """Assert that ``module`` lowers to LiteRT and matches its torch reference.

    int8: at most ``max_steps`` output quantization steps from the PT2E quantized
    reference. float32: ``rtol``/``atol`` against the eager module; an int8 check also runs
    the float one (``float_check``): a wrong constant hides inside one int8 step. Measured on
    ``example_inputs``, held out of the calibration (by default ``seed``-ed inputs around its
    statistics; a ``calibration`` holding it is refused). ``span_rtol``: float error allowed
    relative to each output's largest magnitude (the float form uses at least
    ``FLOAT_FORM_SPAN_RTOL``). With ``expect_delegated`` every
    compute node must be on the NPU side. ``plugins``: plugin modules to use as if installed
    (test a plugin before packaging it).
    """
    if plugins:
        from etforge.core.registry.manager import extra_plugins

        with extra_plugins(*plugins):
            return check_op(module, example_inputs, target, quantize, max_steps, rtol, atol, calibration,
                            expect_delegated, options, seed, float_check=float_check, span_rtol=span_rtol)  # fmt: skip
    from etforge.core.build import pipeline
    from etforge.core.registry.manager import registry

    reg = registry()
    tgt = reg.target(target)
    if not quantize:  # the converters on float tensors, whatever dtypes the NPU runs
        from etforge.runtime.verification.float_check import float_target

        tgt = float_target(tgt)
    example = tuple(example_inputs)
    module = module.eval()
    ep = pipeline.export(module, example)
    ep, _ = pipeline.rewrite(ep, tgt, reg)  # the target's graph rewrites, as compile runs them
    if quantize:
        calib = [tuple(c) for c in calibration] if calibration is not None else _calibration(example, 8, seed)
        _held_out(example, calib)
        ep = pipeline.quantize(ep, tgt, calib, reg)
        reference = [t.detach() for t in _flat(ep.module()(*example))]
    else:
        with torch.no_grad():
            reference = [t.detach() for t in _flat(module(*example))]
    edge, partitioner, parts, _ = pipeline.lower(ep, tgt, options, reg)
    forms = _output_forms(edge.exported_program(), dequantize_forms(tgt, reg))
    delegated = [d.node for d in partitioner.decisions if d.npu]
    refused = {f"{d.node} ({d.op})": d.reason for d in partitioner.decisions if not d.npu}
    ops = [op for p in parts for op in p.converted.operators]
    if expect_delegated and refused:
        raise OpCheckError(
            "nodes were not delegated:\n" + "\n".join(f"  {k}: {v}" for k, v in refused.items())
        )
    tol = _Tolerance(quantize, max_steps, rtol, atol, span_rtol)
    worst_steps, mean_steps, worst_rel, outputs = _compare(
        edge.exported_program(), example, reference, tol, ops, forms
    )
    if quantize and float_check:  # the same converters on float32 tensors
        try:
            floats = check_op(module, example, target, False, max_steps, rtol, max(atol, FLOAT_FORM_ATOL), None, False,
                              options, seed, float_check=False,
                              span_rtol=max(span_rtol, FLOAT_FORM_SPAN_RTOL))  # fmt: skip
        except OpCheckError as exc:
            raise OpCheckError(f"float form: {exc}") from None
        worst_rel = floats.max_rel
    return OpCheck(worst_steps, mean_steps, worst_rel, ops, delegated, refused, outputs, reference)


@dataclass
class _Tolerance:
    """What ``check_op`` allows: quantization steps for int8 outputs, rtol/atol for float ones."""

    quantize: bool
    max_steps: float
    rtol: float
    atol: float
    span_rtol: float = 0.0


def _compare(
    edge_ep: Any,
    example: tuple[torch.Tensor, ...],
    reference: list[torch.Tensor],
    tol: _Tolerance,
    ops: list[str],
    forms: list[OutputForm],
) -> tuple[float, float, float, list[torch.Tensor]]:
    """(worst steps, worst mean steps, worst relative error, outputs) of the lowered program on
    ``example`` against ``reference`` with both LiteRT kernel sets: a converter must be right
    whichever rounding runs it."""
    from etforge.runtime.execution.host import run_program
    from etforge.runtime.execution.litert_run import KERNELS

    worst_steps, mean_steps, worst_rel = 0.0, 0.0, 0.0
    outputs: list[torch.Tensor] = []
    for kernels in KERNELS:
        outputs = [o for o in run_program(edge_ep, example, kernels) if isinstance(o, torch.Tensor)]
        if len(outputs) != len(reference):
            raise OpCheckError(f"{len(outputs)} outputs, reference has {len(reference)}")
        for i, (got, ref) in enumerate(zip(outputs, reference, strict=True)):
            if tuple(got.shape) != tuple(ref.shape):
                raise OpCheckError(
                    f"output {i}: shape {list(got.shape)} != reference {list(ref.shape)}; LiteRT ops {ops}"
                )
            diff = (got.to(torch.float64) - ref.to(torch.float64)).abs()
            form = forms[i] if i < len(forms) else OutputForm(None, None)
            where = f"output {i} ({form.describe()})", f"with LiteRT's {kernels} kernels", f"LiteRT ops {ops}"
            if tol.quantize and form.scale:
                worst, mean = _steps(diff, form.scale, tol, where)
                worst_steps, mean_steps = max(worst_steps, worst), max(mean_steps, mean)
            else:
                worst_rel = max(worst_rel, _relative(diff, ref, tol, where))
    return worst_steps, mean_steps, worst_rel, outputs


def _steps(
    diff: torch.Tensor, scale: float, tol: _Tolerance, where: tuple[str, str, str]
) -> tuple[float, float]:
    """(worst, mean) distance in output quantization steps; beyond ``max_steps`` an error."""
    steps = diff / scale
    worst = float(steps.max()) if steps.numel() else 0.0
    mean = float(steps.mean()) if steps.numel() else 0.0
    if worst > tol.max_steps + 1e-3:
        name, kernels, ops = where
        raise OpCheckError(
            f"{name}: max error {worst:.2f} quantization steps > max_steps={tol.max_steps} "
            f"{kernels}; mean {mean:.3f}; {ops}"
        )
    return worst, mean


def _relative(diff: torch.Tensor, ref: torch.Tensor, tol: _Tolerance, where: tuple[str, str, str]) -> float:
    """The worst relative error; any value beyond ``atol + rtol * |ref| + span_rtol * max |ref|``
    an error."""
    magnitude = ref.abs().to(torch.float64)
    rel = float((diff / (magnitude + tol.atol)).max()) if diff.numel() else 0.0
    span = float(magnitude.max()) * tol.span_rtol if magnitude.numel() else 0.0
    if bool((diff > tol.atol + span + tol.rtol * magnitude).any()):
        name, kernels, ops = where
        at = int((diff - (tol.atol + span + tol.rtol * magnitude)).argmax())
        raise OpCheckError(
            f"{name}: max abs error {float(diff.max()):.3g} beyond rtol={tol.rtol}, atol={tol.atol}, "
            f"span_rtol={tol.span_rtol} (at flat index {at}: {float(diff.flatten()[at]):.3g} off a "
            f"reference of {float(ref.flatten()[at]):.4g}) {kernels}; {ops}"
        )
    return rel


def _flat(out: Any) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    flat: list[torch.Tensor] = []
    for o in out:
        flat.extend(_flat(o))
    return flat
