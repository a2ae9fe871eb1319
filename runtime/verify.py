"""``etforge verify OUT``: run the compiled program on the host and compare with torch.

The lowered program is rebuilt from ``quantized.pt2`` with the recorded target and
options, and must reproduce ``partitions/*.tflite`` byte for byte — so what runs here is
what the ``.pte`` holds. NPU partitions run in LiteRT, Cortex-M ops as their reference
implementations, everything else in torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.export import ExportedProgram

from etforge.core import output, payload
from etforge.core.errors import EtforgeError
from etforge.core.graph_utils import node_op
from etforge.core.load import load_program
from etforge.core.plugin_manager import Registry, registry
from etforge.runtime.accuracy import DEFAULT_MAX_ACCURACY_DROP, Labeled, evaluate
from etforge.runtime.host import run_program
from etforge.runtime.pte_agreement import Agreement, compare_with_edge
from etforge.runtime.pte_interpreter import PteInterpreter
from etforge.runtime.reference import run_float64
from etforge.runtime.stepwise import HostInt8Values, OpParity, op_parity

# The gates. Each is a fixed number, never a figure measured from the model under test (a
# bound derived from the model's own behaviour loosens itself exactly where it should hold).

#: Steps an NPU op may be from the reference op fed the same int8 inputs: one rounding of the
#: requantization (a value on a rounding boundary may land on either side), no more.
OP_MAX_STEPS = 1
#: Share of one NPU op's values (over all samples) that may be exactly one step off, per LiteRT
#: kernel set. A correct conversion with the default kernels rounds as the reference does and is
#: one step off only where float evaluation order decides a tie: at most 1 in 10,000 values
#: per op on the zoo; a wrong constant inside the tolerance of OP_MAX_STEPS (tanh-approximate
#: GELU for exact GELU) puts about 1 in 100 values one step off. 1 in 1,000 sits between them
#: with a factor of ten either side. The reference kernels' fixed-point requantization rounds
#: twice and is itself one step off on up to ~0.3% of an op's values (zoo), hence 1%.
OFF_BY_ONE_MAX_FRACTION = {"default": 0.001, "reference": 0.01}
#: An op with at most this many values one step off passes the share rule whatever its size:
#: on an op of a few hundred values one or two boundary ties are already a percent.
OFF_BY_ONE_FREE = 8
#: Top-1 disagreements allowed per 32 seeded samples with the quantized reference's exact
#: value (float64; the float model for float programs): an int8 program may flip one
#: near-tied input in 32, not more.
TOP1_MISSES_PER_32 = 1


@dataclass
class Verification:
    samples: int
    max_steps: float | None
    mean_steps: float | None
    top1_vs_quantized: int | None
    top1_vs_float: int | None
    max_abs_vs_float: float
    whole_model_on_npu: bool
    #: Per NPU op, teacher-forced (``runtime.stepwise``): worst steps, values off, values.
    op_max_steps: int | None = None
    op_values_off: int = 0
    op_values: int = 0
    worst_op: str | None = None
    #: The same for CPU ops (CMSIS-NN / portable kernels; reported, not gated: the
    #: kernels are ExecuTorch's, the check shows their rounding).
    cpu_op_max_steps: int | None = None
    cpu_values_off: int = 0
    cpu_values: int = 0
    #: The reference's own precision (``runtime.reference``): its float32 evaluation vs
    #: its float64 one — worst output steps and top-1 agreement — and ours vs float64.
    reference_spread_steps: float | None = None
    reference_spread_top1: int | None = None
    max_steps_vs_exact: float | None = None
    top1_required: int | None = None
    #: Top-1 agreement with the reference's exact (float64) value: what the gate counts.
    top1_vs_exact: int | None = None
    #: Values one step off over every NPU op (``OFF_BY_ONE_MAX_FRACTION`` is per op).
    op_off_by_one: int = 0
    #: Per op (NPU and CPU), summed over the samples: partition ("cpu" for CPU ops), node,
    #: max_steps, values, values_off, off_by_one.
    ops: list[dict[str, Any]] = field(default_factory=list)
    #: Values the per-op check could not compare (counted, never dropped), and per node why.
    skipped_values: int = 0
    skipped: list[dict[str, Any]] = field(default_factory=list)
    #: With labeled data (``--data``): top-1 accuracy in percent and the drop in points.
    data: str | None = None
    data_samples: int | None = None
    float_accuracy: float | None = None
    compiled_accuracy: float | None = None
    accuracy_drop: float | None = None
    max_accuracy_drop: float | None = None
    #: ``model.pte`` itself, run by the host interpreter, against the Edge-level run above.
    pte: Agreement | None = None
    failures: list[str] = field(default_factory=list)
    #: What the user should know about how this was verified (not failures).
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures


def _output_scale(program: ExportedProgram) -> float | None:
    out = next(n for n in program.graph_module.graph.nodes if n.op == "output")
    arg = out.args[0][0]
    if hasattr(arg, "op") and node_op(arg).split(".")[-2:] == ["dequantize_per_tensor", "default"]:
        scale = arg.args[1]
        return float(scale) if isinstance(scale, float) else None
    return None


def _inputs(report: dict[str, Any], seed: int, count: int) -> list[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(seed)
    channels_last = report["options"].get("dim_order") == "channels_last"
    batches = []
    for _ in range(count):
        batch = []
        for spec in report["inputs"]:
            t = torch.randn(spec["shape"], generator=g).to(getattr(torch, spec["dtype"]))
            if channels_last and t.dim() == 4:
                t = t.to(memory_format=torch.channels_last)
            batch.append(t)
        batches.append(tuple(batch))
    return batches


def _first_output(out: Any) -> torch.Tensor:
    """A module's (first) output tensor: multi-output models return a tuple."""
    return out[0] if isinstance(out, (tuple, list)) else out


def top1_agrees(ours: torch.Tensor, ref: torch.Tensor) -> bool:
    """Each row's top class agrees, ties included.

    An int8 output cannot order two classes whose scores fall on the same step: when one
    side's top value is shared by several classes, picking any of them agrees (``argmax``
    alone would count a tie broken by index as a disagreement).
    """
    a, b = ours.flatten(1), ref.flatten(1)
    pick_a, pick_b = a.argmax(1, keepdim=True), b.argmax(1, keepdim=True)
    tied_in_ref = b.gather(1, pick_a).eq(b.amax(1, keepdim=True))
    tied_in_ours = a.gather(1, pick_b).eq(a.amax(1, keepdim=True))
    return bool((tied_in_ref | tied_in_ours).all())


def top1_required(samples: int) -> int:
    """Agreements ``verify`` requires of ``samples``: all but ``TOP1_MISSES_PER_32`` per 32."""
    return samples - samples // 32 * TOP1_MISSES_PER_32


def off_by_one_allowed(values: int, kernels: str) -> int:
    """Values of one op (of ``values``) that may be one step off: a fixed share, never fewer
    than ``OFF_BY_ONE_FREE``."""
    return max(OFF_BY_ONE_FREE, int(OFF_BY_ONE_MAX_FRACTION[kernels] * values))


def _per_op(found: list[OpParity]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(compared ops, skipped values) summed over samples, in first-seen order."""
    ops: dict[tuple[str, str], dict[str, Any]] = {}
    skipped: dict[tuple[str, str, str], dict[str, Any]] = {}
    for p in found:
        if p.skipped:
            k = (p.partition, p.node, p.skip_reason)
            e = skipped.setdefault(
                k, {"partition": p.partition, "node": p.node, "values": 0, "reason": p.skip_reason}
            )
            e["values"] += p.skipped
            continue
        o = ops.setdefault(
            (p.partition, p.node),
            {
                "partition": p.partition,
                "node": p.node,
                "max_steps": 0,
                "values": 0,
                "values_off": 0,
                "off_by_one": 0,
            },
        )
        o["max_steps"] = max(o["max_steps"], p.max_steps)
        o["values"] += p.elements
        o["values_off"] += p.elements_off
        o["off_by_one"] += p.off_by_one
    return list(ops.values()), list(skipped.values())


def rebuild(
    out: Path, report: dict[str, Any], reg: Registry
) -> tuple[ExportedProgram, ExportedProgram, ExportedProgram | None, dict[bytes, Any]]:
    """(lowered host program, float program, quantized program, host stand-ins) from a
    compile's outputs; the stand-ins map each device payload (NPU microcode) to the LiteRT
    partition it was compiled from, which is what the host can run."""
    from etforge.core.pipeline import lower

    float_ep = load_program(out / output.FLOAT_PROGRAM)
    qpath = out / output.QUANTIZED_PROGRAM
    qep = load_program(qpath) if report["quantized"] else None
    target = reg.target(report["target"])
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in report["options"].items()}
    edge, _, parts, _ = lower(qep if qep is not None else float_ep, target, options, reg)
    for p in parts:
        saved = out / "partitions" / f"{p.name}.tflite"
        if not saved.is_file() or saved.read_bytes() != p.converted.tflite:
            raise EtforgeError(
                f"{saved}: does not match the program rebuilt from {qpath.name}; recompile {out}"
            )
    stand_ins = {
        p.processed: payload.Blob(
            payload.FORMAT_LITERT_HOST,
            p.name,
            True,
            p.converted.tflite,
            {
                "input_dim_orders": [list(d) for d in p.converted.input_dim_orders],
                "output_dim_orders": [list(d) for d in p.converted.output_dim_orders],
            },
        )
        for p in parts
        if not p.host_only
    }
    return edge.exported_program(), float_ep, qep, stand_ins


def verify(
    out: Path,
    samples: int = 32,
    seed: int = 0,
    max_steps: float | None = None,
    min_top1: int | None = None,
    kernels: str = "default",
    data: str | None = None,
    max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP,
) -> Verification:
    """Verify the compile in ``out``; ``data``: labeled samples (``runtime.accuracy``) to
    measure the accuracy drop on."""
    from etforge.core.load import check_program_file
    from etforge.core.pte_check import check_pte

    output.recover(out)  # a swap cut short by a kill is finished first
    report_path = out / output.REPORT
    if not report_path.is_file() or not (out / output.PTE).is_file():
        raise EtforgeError(
            f"{out}: no compiled program here (missing {output.PTE} or {output.REPORT}); run etforge compile first"
        )
    report = output.load_report(report_path)  # corrupt or foreign: named, not a traceback
    check_program_file(out / output.FLOAT_PROGRAM)  # truncated programs: named, not a zip traceback
    if report["quantized"]:
        check_program_file(out / output.QUANTIZED_PROGRAM)
    pte_path = out / output.PTE  # empty, truncated, corrupt or not this report's: refused here
    interp = PteInterpreter(check_pte(pte_path, report), str(pte_path))
    labeled = None
    if data is not None:
        from etforge.runtime.accuracy import load_labeled

        labeled = load_labeled(data, report)  # bad data fails before the long rebuild
    program, float_ep, qep, stand_ins = rebuild(out, report, registry())
    edge_outputs: list[list[torch.Tensor]] = []
    with payload.host_stand_ins(stand_ins):
        result, agreement = _run_checks(
            interp, program, float_ep, qep, report, samples, seed, max_steps, min_top1, kernels,
            labeled, max_accuracy_drop, edge_outputs,
        )  # fmt: skip
    if stand_ins:
        names = ", ".join(sorted(b.partition for b in stand_ins.values()))
        result.notes.append(
            f"NPU partitions {names} are device microcode, which runs on the NPU only: verified "
            "the LiteRT partitions the NPU compiler compiled them from, in their place"
        )
    if not agreement.ok:
        result.failures.insert(
            0,
            f"{pte_path} differs from the Edge program on {agreement.samples - agreement.agreed}/"
            f"{agreement.samples} samples: {agreement.first_difference}",
        )
    return result


def _run_checks(
    interp: PteInterpreter,
    program: ExportedProgram,
    float_ep: ExportedProgram,
    qep: ExportedProgram | None,
    report: dict[str, Any],
    samples: int,
    seed: int,
    max_steps: float | None,
    min_top1: int | None,
    kernels: str,
    labeled: Any,
    max_accuracy_drop: float,
    edge_outputs: list[list[torch.Tensor]],
) -> tuple[Verification, Agreement]:
    result = compare(
        program,
        float_ep,
        qep,
        report,
        samples=samples,
        seed=seed,
        max_steps=max_steps,
        min_top1=min_top1,
        kernels=kernels,
        data=labeled,
        max_accuracy_drop=max_accuracy_drop,
        edge_outputs=edge_outputs,
    )
    batches = _inputs(report, seed, samples)
    result.pte = agreement = compare_with_edge(interp, program, batches, kernels, edge_outputs)
    return result, agreement


def compare(
    program: ExportedProgram,
    float_ep: ExportedProgram,
    qep: ExportedProgram | None,
    report: dict[str, Any],
    samples: int = 32,
    seed: int = 0,
    max_steps: float | None = None,
    min_top1: int | None = None,
    kernels: str = "default",
    data: Labeled | None = None,
    max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP,
    edge_outputs: list[list[torch.Tensor]] | None = None,
) -> Verification:
    """Run ``program`` on seeded inputs and compare with the float and quantized references.

    Gates (fixed constants above): every NPU op within ``OP_MAX_STEPS`` of the reference op on
    the same inputs, and no more than ``OFF_BY_ONE_MAX_FRACTION`` of its values one step off
    (``runtime.stepwise``, teacher-forced); top-1 agreement with the quantized reference's exact
    (float64) value on all but ``TOP1_MISSES_PER_32`` per 32 samples (``min_top1`` overrides);
    with ``max_steps``, the output within that many steps of the exact value; with ``data``,
    the accuracy drop within ``max_accuracy_drop`` points. The end-to-end steps are otherwise
    reported, not gated: on random weights they measure how the network amplifies legitimate
    one-step rounding (MobileNetV2-96: 23 steps with every op within one), not the conversion.
    """
    scale = _output_scale(program)
    float_fn = float_ep.module()
    q_fn = qep.module() if qep is not None else None
    worst, total, count = 0.0, 0.0, 0
    spread, vs_exact, top1_spread, top1_exact = 0.0, 0.0, 0, 0
    top1_q = top1_f = 0
    max_abs_f = 0.0
    ops: list[OpParity] = []
    cpu_ops: list[OpParity] = []
    for batch in _inputs(report, seed, samples):
        calls: list[Any] = []
        values = HostInt8Values()
        outs = run_program(program, batch, kernels, calls, values)
        if edge_outputs is not None:  # the .pte interpreter is compared with them (``verify``)
            edge_outputs.append(outs)
        ours = outs[0].float()
        for lowered, args in calls:
            ops.extend(op_parity(lowered, args, kernels))
        if q_fn is not None:
            cpu_ops.extend(values.compare(q_fn, batch))
        with torch.no_grad():
            # The first output of a multi-output model, as ``ours`` (run_program(...)[0]).
            ref_f = _first_output(float_fn(*batch))
            ref_q = _first_output(q_fn(*batch)) if q_fn is not None else ref_f
        exact = run_float64(q_fn, batch)[0] if q_fn is not None else ref_q
        max_abs_f = max(max_abs_f, float((ours - ref_f).abs().max()))
        if scale:
            steps = (ours - ref_q).abs() / scale
            worst = max(worst, float(steps.max()))
            total += float(steps.sum())
            count += steps.numel()
            spread = max(spread, float((ref_q - exact).abs().max()) / scale)
            vs_exact = max(vs_exact, float((ours - exact).abs().max()) / scale)
        top1_spread += int(top1_agrees(ref_q, exact))
        top1_exact += int(top1_agrees(ours, exact))
        top1_q += int(top1_agrees(ours, ref_q))
        top1_f += int(top1_agrees(ours, ref_f))
    on_npu = all(n["placement"] == "npu" for n in report["nodes"]) and bool(report["nodes"])
    result = Verification(
        samples=samples,
        max_steps=worst if scale else None,
        mean_steps=(total / count) if count else None,
        top1_vs_quantized=top1_q,
        top1_vs_float=top1_f,
        max_abs_vs_float=max_abs_f,
        whole_model_on_npu=on_npu,
    )
    if q_fn is not None:
        result.reference_spread_top1, result.top1_vs_exact = top1_spread, top1_exact
    if scale and q_fn is not None:
        result.reference_spread_steps, result.max_steps_vs_exact = spread, vs_exact
    npu_ops, npu_skipped = _per_op(ops)
    cpu_summary, cpu_skipped = _per_op(cpu_ops)
    result.ops = npu_ops + cpu_summary
    result.skipped = npu_skipped + cpu_skipped
    result.skipped_values = sum(e["values"] for e in result.skipped)
    if cpu_summary:
        result.cpu_op_max_steps = max(o["max_steps"] for o in cpu_summary)
        result.cpu_values_off = sum(o["values_off"] for o in cpu_summary)
        result.cpu_values = sum(o["values"] for o in cpu_summary)
    if npu_ops:
        worst_op = max(npu_ops, key=lambda o: o["max_steps"])
        result.op_max_steps, result.worst_op = (
            worst_op["max_steps"],
            f"{worst_op['partition']}:{worst_op['node']}",
        )
        result.op_values_off = sum(o["values_off"] for o in npu_ops)
        result.op_values = sum(o["values"] for o in npu_ops)
        result.op_off_by_one = sum(o["off_by_one"] for o in npu_ops)
        if worst_op["max_steps"] > OP_MAX_STEPS:
            result.failures.append(
                f"NPU op {result.worst_op} is {worst_op['max_steps']} steps from the reference op on the "
                f"same inputs (> {OP_MAX_STEPS}): a conversion error"
            )
        for o in npu_ops:
            allowed = off_by_one_allowed(o["values"], kernels)
            if o["off_by_one"] > allowed:
                result.failures.append(
                    f"NPU op {o['partition']}:{o['node']} has {o['off_by_one']:,} of {o['values']:,} values one "
                    f"step off the reference op on the same inputs (> {allowed:,}: "
                    f"{OFF_BY_ONE_MAX_FRACTION[kernels]:.1%} with the {kernels} kernels): a wrong constant, "
                    "not rounding"
                )
    need = result.top1_required = min_top1 if min_top1 is not None else top1_required(samples)
    agree, against = (
        (top1_exact, "the quantized reference (exact value)")
        if q_fn is not None
        else (top1_f, "the float model")
    )
    if agree < need:
        every_op_close = max(result.op_max_steps or 0, result.cpu_op_max_steps or 0) <= OP_MAX_STEPS
        why = (
            f" (every op is within {OP_MAX_STEPS} step of its reference op on the same inputs: the "
            "network amplifies the kernels' rounding, not a conversion error)"
            if every_op_close and (ops or cpu_ops)
            else ""
        )
        result.failures.append(f"top-1 agreement with {against} {agree}/{samples} < {need}/{samples}{why}")
    if max_steps is not None and scale and q_fn is not None and vs_exact > max_steps:
        result.failures.append(
            f"max difference from the quantized reference (exact value) {vs_exact:.1f} steps > {max_steps:g}"
        )
    if data is not None:
        acc = evaluate(program, float_ep, data, report, kernels)
        result.data, result.data_samples = data.source, acc.samples
        result.float_accuracy, result.compiled_accuracy = acc.float_accuracy, acc.compiled_accuracy
        result.accuracy_drop, result.max_accuracy_drop = acc.drop, max_accuracy_drop
        if acc.drop > max_accuracy_drop:
            result.failures.append(
                f"accuracy on {data.source} ({acc.samples} samples): compiled {acc.compiled_accuracy:.2f}% vs "
                f"float {acc.float_accuracy:.2f}%, a drop of {acc.drop:.2f} points > {max_accuracy_drop:g}"
            )
    return result
