"""``etforge verify OUT``: run the compiled program on the host and compare with torch.

The lowered program is rebuilt from ``quantized.pt2`` with the recorded target and
options, its NPU partitions the compile's hash-checked ``partitions/*.tflite`` (``--reconvert``:
converted again and required equal to them byte for byte), and every delegate payload in the
``.pte`` must equal the rebuilt one — so what runs here is what the ``.pte`` holds. NPU partitions run in LiteRT, Cortex-M ops as their reference
implementations, everything else in torch; each op and the whole output are judged against
the quantized program computed in the device's arithmetic (docs/report.md).
"""

from __future__ import annotations

import gc
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch.export import ExportedProgram

from etforge.core.build import output
from etforge.core.common.errors import EtforgeError
from etforge.core.common.threads import one_thread
from etforge.core.litert import payload
from etforge.core.registry.manager import Registry, registry
from etforge.runtime.execution import kernel_memo, litert_run
from etforge.runtime.execution.host import run_program
from etforge.runtime.execution.pte_interpreter import PteInterpreter
from etforge.runtime.verification import deferred_imports, exact_pass
from etforge.runtime.verification.accuracy import DEFAULT_MAX_ACCURACY_DROP, Labeled, evaluate
from etforge.runtime.verification.ahead import Ahead
from etforge.runtime.verification.beside import Beside
from etforge.runtime.verification.constant_fold import folded
from etforge.runtime.verification.constant_nodes import ConstantNodes
from etforge.runtime.verification.exact_batched import exact_leaves_all
from etforge.runtime.verification.exact_sums import Sums
from etforge.runtime.verification.inputs import seeded_inputs
from etforge.runtime.verification.lifted import lifted_call, unlifted
from etforge.runtime.verification.outputs import (
    OutputCheck,
    flatten,
    leaf_scales,
    top1_agrees,
)
from etforge.runtime.verification.pte_agreement import Agreement, compare_with_edge
from etforge.runtime.verification.sample_pass import BatchState, chunk_size, simulations
from etforge.runtime.verification.simulate import SIM_MAX_STEPS, output_steps
from etforge.runtime.verification.stepwise import (
    DEVICE_KERNELS,
    HostInt8Values,
    OpParity,
    observer_names,
    op_parity,
)
from etforge.runtime.verification.verify_steps import Steps

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
#: Values an NPU op may differ from its device-exact reference (``runtime.arithmetic.device_ref``): the
#: reference computes the Edge op in the device kernels' integer arithmetic, so a correct
#: conversion is bit-exact and any value off is a conversion error.
EXACT_VALUES_OFF = 0
#: Values a CPU op may differ from its reference on the host's own inputs (``runtime.verification.stepwise``:
#: the quantized program run with every int8 value the host computed — CPU ops and partition
#: outputs — forced to the host's). A Cortex-M op's reference is its Edge op in CMSIS-NN's
#: integer arithmetic (the Cortex-M plugin's ``cortex_m_host.cmsis_reference``), a portable op's is the same
#: dequantize / float op / quantize in torch: a correct lowering is bit-exact, so any value off
#: is a lowering or kernel error.
CPU_EXACT_VALUES_OFF = 0
#: Steps a CPU op with no exact reference yet (listed as ``cpu_not_exact``: a Cortex-M op whose
#: Edge op has no rule) may be from torch's op on the same inputs: one rounding, as for NPU ops
#: without a rule (``OP_MAX_STEPS``); a miscompile is tens to 255 steps off.
CPU_OP_MAX_STEPS = 1
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
    #: Per NPU op, teacher-forced (``runtime.verification.stepwise``): worst steps, values off, values.
    op_max_steps: int | None = None
    op_values_off: int = 0
    op_values: int = 0
    worst_op: str | None = None
    #: The same for CPU ops (CMSIS-NN / portable kernels), against their exact references.
    cpu_op_max_steps: int | None = None
    cpu_values_off: int = 0
    cpu_values: int = 0
    #: The reference's own precision (``runtime.verification.reference``): its float32 evaluation vs
    #: its float64 one — worst output steps and top-1 agreement — and ours vs float64.
    reference_spread_steps: float | None = None
    reference_spread_top1: int | None = None
    max_steps_vs_exact: float | None = None
    top1_required: int | None = None
    #: Top-1 agreement with the reference's exact (float64) value: what the gate counts.
    top1_vs_exact: int | None = None
    #: The float64 reference's convs / linears summed as integers (``runtime.verification.exact_sums``),
    #: and the others (node: why) summed by torch's float64 op, as before.
    reference_integer_sums: int = 0
    reference_float64_sums: dict[str, str] = field(default_factory=dict)
    #: Values one step off over every NPU op (``OFF_BY_ONE_MAX_FRACTION`` is per op).
    op_off_by_one: int = 0
    #: Per op (NPU and CPU), summed over the samples: partition ("cpu" for CPU ops), node,
    #: max_steps, values, values_off, off_by_one.
    ops: list[dict[str, Any]] = field(default_factory=list)
    #: NPU ops compared with torch (<= 1 step rule) for want of a device-exact rule: node, why.
    not_exact: list[dict[str, Any]] = field(default_factory=list)
    #: CPU ops compared with torch (<= ``CPU_OP_MAX_STEPS``) for want of an exact reference: node, why.
    cpu_not_exact: list[dict[str, Any]] = field(default_factory=list)
    #: NPU values compared with their device-exact reference, and how many of them were off.
    exact_values: int = 0
    exact_values_off: int = 0
    #: The float check (``runtime.verification.float_check``): each NPU op of the float-lowered program
    #: against its float Edge op; worst relative error and the ops checked.
    float_max_rel: float | None = None
    float_ops: int = 0
    #: Why the float check ran on the unfolded float program (BatchNorms it could not fold into
    #: their convs, ``runtime.verification.float_program.fold``); None when it folded them or had none.
    float_check_unfolded: str | None = None
    #: What the float check ran on: ``partitions`` (the compiled program's NPU partitions with
    #: their quantize/dequantize pairs removed, ``runtime.verification.float_partitions``) or
    #: ``float.pt2`` (lowered again, where a partition could not be: a note says why).
    float_check_source: str | None = None
    #: The whole program in device arithmetic (``runtime.verification.simulate``): the compiled program's
    #: worst distance over every value of every dequantized output, in steps; the quantize
    #: nodes without a rule, and those whose value came from torch, not the program.
    sim_max_steps: float | None = None
    sim_not_exact: list[str] = field(default_factory=list)
    sim_unforced: list[str] = field(default_factory=list)
    #: The program equals its device simulation (every value): top-1 is then a figure.
    sim_exact: bool = False
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
    #: Per output leaf (``runtime.verification.outputs``): name, kind, what it was compared as, agreement.
    outputs: list[dict[str, Any]] = field(default_factory=list)
    #: Samples whose per-op gates the device simulation's one pass proved (``runtime.verification.exact_pass``);
    #: the others (the first, any with a value off) ran the teacher-forced checks.
    samples_from_simulation: int = 0
    #: Where torch's references ran: on a thread beside the sample loop
    #: (``runtime.verification.beside``), or the main thread (why).
    references_computed_in: str = "the main thread"
    #: Where the compiled program's runs of each sample ran: on a thread ahead of the sample
    #: loop (``runtime.verification.ahead``), or the main thread (why).
    program_runs_in: str = "the main thread"
    #: NPU partition files taken as converted on ``report.json``'s sha256 (the hash chain), not
    #: converted again from ``quantized.pt2`` (``runtime.verification.saved_partitions``), and
    #: those converted again and compared byte for byte (``verify --reconvert``).
    partitions_by_hash: list[str] = field(default_factory=list)
    partitions_reconverted: list[str] = field(default_factory=list)
    #: Which lowered program ran (``runtime.verification.saved_program``): ``saved`` (the compile's
    #: ``lowered_edge.exir``, hash-checked) or ``lowered again`` (from ``quantized.pt2``: ``--rebuild``,
    #: ``--reconvert``, or an output without the file; with the file, it must be the same program).
    lowered_source: str | None = None
    #: Samples the device simulation computed in batched passes (``runtime.verification.sample_pass``),
    #: the passes, and per node the sample runs that went one at a time (an op not exact on stacked samples).
    sim_batched_samples: int = 0
    sim_batched_passes: int = 0
    sim_per_sample_nodes: dict[str, int] = field(default_factory=dict)
    #: Seconds per step (``runtime.verification.verify_steps``): where verify's time went.
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failures


def _inputs(report: dict[str, Any], seed: int, count: int) -> list[tuple[torch.Tensor, ...]]:
    return seeded_inputs(report, seed, count)  # integer inputs within their recorded range


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
                "device_exact": p.device_exact,
                "reason": p.reason,
                "first_off": "",
                "torch_max_steps": 0,
                "torch_values_off": 0,
            },
        )
        o["device_exact"] = o["device_exact"] and p.device_exact
        o["reason"] = o["reason"] or p.reason
        o["first_off"] = o["first_off"] or p.first_off
        o["torch_max_steps"] = max(o["torch_max_steps"], p.torch_max_steps)
        o["torch_values_off"] += p.torch_values_off
        o["max_steps"] = max(o["max_steps"], p.max_steps)
        o["values"] += p.elements
        o["values_off"] += p.elements_off
        o["off_by_one"] += p.off_by_one
    return list(ops.values()), list(skipped.values())


def _programs(out: Path, report: dict[str, Any]) -> tuple[ExportedProgram, ExportedProgram | None]:
    """(float program, quantized program) of a compile's outputs."""
    float_ep = deferred_imports.load_program(out / output.FLOAT_PROGRAM)
    qep = deferred_imports.load_program(out / output.QUANTIZED_PROGRAM) if report["quantized"] else None
    return float_ep, qep


def _stand_ins(parts: list[Any]) -> dict[bytes, Any]:
    """Each device payload (NPU microcode) -> the LiteRT partition it was compiled from, which
    is what the host can run."""
    return {
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


def load_saved(
    out: Path, report: dict[str, Any], parts_out: list[Any] | None = None
) -> tuple[ExportedProgram, ExportedProgram, ExportedProgram | None, dict[bytes, Any]]:
    """As :func:`rebuild`, the lowered program the compile saved (``lowered_edge.exir``,
    ``runtime.verification.saved_program``) instead of lowering ``quantized.pt2`` again."""
    from etforge.runtime.verification import saved_program

    float_ep, qep = _programs(out, report)
    program, parts = saved_program.load(out, report)
    if parts_out is not None:
        parts_out.extend(parts)
    return program, float_ep, qep, _stand_ins(parts)


def rebuild(
    out: Path,
    report: dict[str, Any],
    reg: Registry,
    parts_out: list[Any] | None = None,
    reconvert: bool = False,
    given_out: list[str] | None = None,
) -> tuple[ExportedProgram, ExportedProgram, ExportedProgram | None, dict[bytes, Any]]:
    """(lowered host program, float program, quantized program, host stand-ins) from a
    compile's outputs, lowering ``quantized.pt2`` again; the stand-ins map each device payload
    (NPU microcode) to the LiteRT partition it was compiled from, which is what the host can run.

    The NPU partitions are the compile's hash-checked ``partitions/*.tflite``, not converted
    again (``runtime.verification.saved_partitions``; ``given_out`` gets their names), unless
    ``reconvert``: then the converters run again and must reproduce the files byte for byte."""
    from etforge.core.build.pipeline import lower
    from etforge.core.lower.npu_backend import given_conversions
    from etforge.runtime.verification.saved_partitions import conversions

    float_ep, qep = _programs(out, report)
    qpath = out / output.QUANTIZED_PROGRAM
    target = reg.target(report["target"])
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in report["options"].items()}
    # The path the compile took (report.json): a classic compile (``lowering="classic"``, a
    # script's .pte) is rebuilt classic, so its payloads are compared with their own kind.
    early = (report.get("lowering") or {}).get("path") != "classic"
    given = {} if reconvert else conversions(out, report)
    with given_conversions(given):
        edge, _, parts, _ = lower(qep if qep is not None else float_ep, target, options, reg, early=early)
    if parts_out is not None:
        parts_out.extend(parts)
    if given_out is not None:
        given_out.extend(p.name for p in parts if given.get(p.name) is p.converted)
    for p in parts:
        saved = out / "partitions" / f"{p.name}.tflite"
        if not saved.is_file() or saved.read_bytes() != p.converted.tflite:
            raise EtforgeError(
                f"{saved}: does not match the program rebuilt from {qpath.name}; recompile {out}"
            )
    return edge.exported_program(), float_ep, qep, _stand_ins(parts)


def verify(
    out: Path,
    samples: int = 32,
    seed: int = 0,
    max_steps: float | None = None,
    min_top1: int | None = None,
    kernels: str = "default",
    data: str | None = None,
    max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP,
    steps: Steps | None = None,
    report_fields: bool = True,
    reconvert: bool = False,
    lower_again: bool = False,
) -> Verification:
    """Verify the compile in ``out``; ``lower_again``: lower ``quantized.pt2`` again and require
    the compile's saved lowered program to be that program (default: the saved one, hash-checked,
    runs: ``runtime.verification.saved_program``); ``reconvert`` (implies ``lower_again``): convert the NPU partitions again and
    require the compile's ``partitions/*.tflite`` byte for byte (default: those hash-checked
    files are taken as converted, ``runtime.verification.saved_partitions``); ``data``: labeled samples (``runtime.verification.accuracy``) to
    measure the accuracy drop on; ``steps``: progress callbacks (``runtime.verification.verify_steps``);
    ``report_fields=False`` only where report.json is etforge's reference compile beside
    another program (``script_pte``): its firmware fields then describe the reference, not
    the program run, and no firmware is generated from them."""
    from etforge.core.common.threads import one_thread

    steps = steps or Steps()
    with one_thread():  # batch-1 ops: a spinning OpenMP pool only takes cores from others
        result = _verify(
            out, samples, seed, max_steps, min_top1, kernels, data, max_accuracy_drop, steps, report_fields,
            reconvert, lower_again,
        )  # fmt: skip
    result.seconds = dict(steps.seconds)
    return result


def _verify(
    out: Path,
    samples: int,
    seed: int,
    max_steps: float | None,
    min_top1: int | None,
    kernels: str,
    data: str | None,
    max_accuracy_drop: float,
    steps: Steps,
    report_fields: bool = True,
    reconvert: bool = False,
    lower_again: bool = False,
) -> Verification:
    from etforge.core.front.load import check_program_file
    from etforge.core.serialize.pte_check import check_pte

    output.recover(out)  # a swap cut short by a kill is finished first
    report_path = out / output.REPORT
    if not report_path.is_file() or not (out / output.PTE).is_file():
        raise EtforgeError(
            f"{out}: no compiled program here (missing {output.PTE} or {output.REPORT}); run etforge compile first"
        )
    report = output.load_report(report_path)  # corrupt or foreign: named, not a traceback
    from etforge.runtime.verification import artifact

    with steps.step("files", "checking the hash chain and reading the compiled files") as done:
        hash_notes = artifact.check_hashes(out, report)  # a side file from another compile: named
        check_program_file(out / output.FLOAT_PROGRAM)  # truncated programs: named, not a zip traceback
        if report["quantized"]:
            check_program_file(out / output.QUANTIZED_PROGRAM)
        pte_path = out / output.PTE  # empty, truncated, corrupt or not this report's: refused here
        interp = PteInterpreter(check_pte(pte_path, report), str(pte_path))
        if report_fields:
            from etforge.runtime.verification.report_fields import refuse_forged

            refuse_forged(interp.program, pte_path, report)  # the firmware's figures are the program's
        done["line"] = (
            f"hash chain: {output.PTE} and {len(report.get('files_sha256') or {})} side file(s) "
            f"match {output.REPORT}, its firmware fields the program's"
        )
    labeled = None
    if data is not None:
        from etforge.runtime.verification.accuracy import load_labeled

        labeled = load_labeled(data, report)  # bad data fails before the long rebuild
    parts: list[Any] = []
    given: list[str] = []
    source = output.QUANTIZED_PROGRAM if report["quantized"] else output.FLOAT_PROGRAM
    from etforge.runtime.verification import saved_program

    saved = saved_program.available(out, report)
    use_saved = saved and not (lower_again or reconvert)
    lowered_notes: list[str] = []
    lowered_failures: list[str] = []
    unreadable = False
    from etforge.core.serialize.lowered_program import UnreadableProgram

    if use_saved:
        with steps.step(
            "rebuild", f"loading the lowered program the compile saved ({output.LOWERED_PROGRAM})"
        ) as done:
            try:
                program, float_ep, qep, stand_ins = load_saved(out, report, parts)
                given = [p.name for p in parts]
                done["line"] = (
                    f"loaded the lowered program the compile saved ({output.LOWERED_PROGRAM}, hash-checked; not "
                    f"lowered again from {source}): {len(parts)} NPU partition(s), each its partitions/*.tflite"
                )
            except UnreadableProgram as exc:  # lowering again checks at least as much: told
                use_saved, saved, unreadable = False, False, True
                parts.clear()
                lowered_notes.append(
                    f"{exc.args[0].removesuffix('; recompile')}: lowered {source} again instead (as verify --rebuild does)"
                )
                done["line"] = f"{output.LOWERED_PROGRAM} unreadable (note below): lowering {source} again"
    if not use_saved:
        with steps.step("rebuild", f"rebuilding the lowered program from {source}") as done:
            program, float_ep, qep, stand_ins = rebuild(out, report, registry(), parts, reconvert, given)
            done["line"] = f"rebuilt the lowered program from {source}: {len(parts)} NPU partition(s), " + (
                f"{len(given)} of them the hash-checked partitions/*.tflite as converted (not converted again)"
                if given
                else "each converted again and equal to its partitions/*.tflite"
            )
            if saved:  # --rebuild / --reconvert: the saved program must be the one lowered here
                try:
                    kept, _ = saved_program.load(out, report)
                    why = saved_program.same_program(kept, program)
                except UnreadableProgram as exc:  # nothing to compare: told, the rest runs lowered
                    kept, why = None, None
                    lowered_notes.append(f"{exc.args[0].removesuffix('; recompile')}: not compared")
                if why is not None:
                    lowered_failures.append(
                        f"{out / output.LOWERED_PROGRAM}: not the program lowered again from {source}: {why}; "
                        f"recompile {out}"
                    )
                done["line"] += f"; {output.LOWERED_PROGRAM} " + (
                    "unreadable (note below)"
                    if kept is None
                    else "the same program"
                    if why is None
                    else "DIFFERS"
                )
            elif not unreadable:
                lowered_notes.append(
                    f"{out} has no {output.LOWERED_PROGRAM} in its hash chain (compiled by an older etforge): "
                    f"lowered {source} again; recompile to verify without lowering again"
                )
    with steps.step("payloads", "comparing the delegate payloads with the ones run here") as done:
        byte_notes: list[str] = []
        byte_failures = artifact.compare_payloads(
            pte_path, interp.program, {p.name: p.processed for p in parts}, byte_notes, use_saved
        )
        byte_failures += [
            f"{f}: not a partition of the program in {pte_path.name}; remove it or recompile"
            for f in artifact.stray_partition_files(out, [p.name for p in parts])
        ]
        done["line"] = f"payload bytes: {len(parts)} delegate payload(s) " + (
            f"equal to the {'saved' if use_saved else 'rebuilt'} ones; no stray partition files"
            if not byte_failures
            else "DIFFER (below)"
        )
    device = [bytes(d.data) for d in interp.program.backend_delegate_data]
    if byte_failures and any(not raw.startswith(payload.MAGIC) and raw not in stand_ins for raw in device):
        # device code that is not the rebuilt one has no LiteRT source to run in its place
        raise EtforgeError("\n".join(byte_failures))
    edge_outputs: list[list[torch.Tensor]] = []
    batches = _inputs(report, seed, samples)
    with payload.host_stand_ins(stand_ins):
        result = compare(
            program, float_ep, qep, report, samples=samples, seed=seed, max_steps=max_steps,
            min_top1=min_top1, kernels=kernels, data=labeled, max_accuracy_drop=max_accuracy_drop,
            edge_outputs=edge_outputs, steps=steps, memo=(memo := kernel_memo.Store()),
        )  # fmt: skip
        with steps.step("pte", f"running model.pte in the host interpreter on {samples} samples") as done:
            result.pte = agreement = compare_with_edge(interp, program, batches, kernels, edge_outputs, memo)
            done["line"] = (
                f"model.pte (host interpreter, planned offsets) vs the Edge program: {agreement.agreed}/"
                f"{agreement.samples} samples identical"
                + (
                    f"; {agreement.repeated_calls}/{agreement.kernel_calls} host kernel calls byte-identical "
                    "to an Edge run's (its result reused)"
                    if agreement.kernel_calls
                    else ""
                )
            )
            memo.runs.clear()  # the Edge run's tensors it kept
            if agreement.repeated_calls < agreement.kernel_calls:
                result.notes.append(
                    f"model.pte: {agreement.kernel_calls - agreement.repeated_calls} of "
                    f"{agreement.kernel_calls} host kernel calls computed (no Edge run's call on the "
                    "same sample byte-identical to them, or past kernel_memo.MAX_BYTES); "
                    f"{agreement.repeated_calls} took the identical call's result"
                )
    from etforge.runtime.execution.cpu_libraries import not_proven

    ops = {step.name.removesuffix(".out") for step in interp.steps}
    result.notes.extend(
        f"{op}: host kernel not proven equal to the device: {why}"
        for op, why in not_proven().items()
        if op in ops
    )
    if stand_ins:
        names = ", ".join(sorted(b.partition for b in stand_ins.values()))
        result.notes.append(
            f"NPU partitions {names} are device microcode, which runs on the NPU only: verified "
            "the LiteRT partitions the NPU compiler compiled them from, in their place"
        )
    result.notes.extend(hash_notes + byte_notes + lowered_notes)
    result.lowered_source = saved_program.SAVED if use_saved else saved_program.LOWERED_AGAIN
    result.partitions_by_hash = [f"{output.PARTITIONS}/{name}.tflite" for name in given]
    result.partitions_reconverted = [
        f"{output.PARTITIONS}/{p.name}.tflite" for p in parts if p.name not in given
    ]
    if use_saved:
        result.notes.append(
            f"{output.LOWERED_PROGRAM}: the lowered program the compile saved, taken on {output.REPORT}'s sha256, "
            f"not lowered again from {source} (verify --rebuild lowers again and requires the same program); "
            "what it computes is judged by the .pte = Edge, NPU-op, CPU-op and whole-output gates, its "
            f"payloads by the payload-bytes gate (against {output.PTE} and partitions/*.tflite)"
        )
    if given:
        result.notes.append(
            f"{', '.join(result.partitions_by_hash)}: taken as converted on {output.REPORT}'s sha256, not "
            f"converted again from {source} (verify --reconvert converts and compares byte for byte); what "
            "they compute is judged by the NPU-op, whole-output and .pte = Edge gates, their bytes in "
            f"{output.PTE} by the payload-bytes gate"
        )
    from etforge.core.contracts.verify_gate import GateInput
    from etforge.runtime.verification.gates import run_gates

    given = GateInput(out, report, program, interp, batches, edge_outputs)
    run_gates(given, result, steps, registry())  # the plugins' gates (etforge_verify_gates)
    result.failures[:0] = lowered_failures + byte_failures
    if not agreement.ok:
        result.failures.insert(
            0,
            f"{pte_path} differs from the Edge program on {agreement.samples - agreement.agreed}/"
            f"{agreement.samples} samples: {agreement.first_difference}",
        )
    return result


def _references(
    program: ExportedProgram, float_ep: ExportedProgram, q_fn: Any, inputs: list[Any]
) -> tuple[list[list[Any]], list[list[Any]], list[list[Any]], Sums]:
    """Per sample, every output leaf (``runtime.verification.outputs``, the program's order) of
    the quantized program in float64 (exact: a conv / linear of int8 values summed as integers),
    of the float model and of the quantized program in float32; and which convs / linears the
    float64 run summed as integers (``exact_sums.Sums``). Run beside the sample loop (``beside``)."""
    float_fn = lifted_call(float_ep) or float_ep.module(check_guards=False)  # the exported graph itself
    q_ref = folded(q_fn) if q_fn is not None else None  # its float32 run: weights dequantized once
    sums = Sums()  # its convs / linears summed as integers, and those left to torch's float64
    with torch.no_grad():
        float_all = [flatten(program, float_fn(*batch)) for batch in inputs]
        q_all = [flatten(program, q_ref(*batch)) for batch in inputs] if q_ref is not None else float_all
    exact_all = (
        exact_leaves_all(program, q_fn, inputs, ConstantNodes(q_fn.graph), sums)
        if q_fn is not None
        else q_all
    )
    return exact_all, float_all, q_all, sums


@one_thread()  # batch-1 ops: a spinning OpenMP pool only takes cores from others
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
    steps: Steps | None = None,
    memo: kernel_memo.Store | None = None,
) -> Verification:
    """Run ``program`` on seeded inputs and compare with the float and quantized references.

    Gates (fixed constants above; docs/report.md): every NPU op equal to its device-exact
    reference on LiteRT's inputs (``runtime.verification.stepwise``, teacher-forced; an op without a rule
    within ``OP_MAX_STEPS`` and ``OFF_BY_ONE_MAX_FRACTION``, listed); every CPU op equal to its
    reference on the host's inputs (CMSIS-NN arithmetic, or torch for a portable op; without a
    rule within ``CPU_OP_MAX_STEPS``, listed); every output value equal to the whole program
    simulated in the device's arithmetic (``runtime.verification.simulate``); top-1 agreement with the
    quantized reference's exact (float64) value on all but ``TOP1_MISSES_PER_32`` per 32
    samples — a reported figure when the output equals its simulation (``min_top1`` keeps it a
    gate); with ``max_steps``, the output within that many steps of the exact value; with
    ``data``, the accuracy drop within ``max_accuracy_drop`` points. The distance from torch's
    evaluation is otherwise reported, not gated: on random weights it measures how the network
    amplifies rounding torch does differently (MobileNetV2-96: 23 steps), not the conversion.
    """
    import time

    steps = steps or Steps()
    loop_start = time.perf_counter()
    # the host kernels' calls, for model.pte's run on the same inputs (``kernel_memo``)
    recording = partial(kernel_memo.recording, memo) if memo is not None else (lambda run: nullcontext())
    check = OutputCheck(program)
    # unlifted once (module()'s graph, one code generation), read by the references and the simulation
    q_fn = (unlifted(qep) or qep.module(check_guards=False)) if qep is not None else None
    worst, total, count = 0.0, 0.0, 0
    spread, vs_exact, top1_spread, top1_exact = 0.0, 0.0, 0, 0
    top1_q = top1_f = 0
    max_abs_f = 0.0
    ops: list[OpParity] = []
    cpu_ops: list[OpParity] = []
    sim_worst, sim_not_exact, sim_unforced = 0.0, {}, {}
    scales = leaf_scales(program)
    aliases = observer_names(qep) if qep is not None else {}
    template: list[OpParity] | None = None  # the first sample's teacher-forced results
    float_calls: list[list[Any]] = []  # the first samples' delegate calls, for the float check
    # the weights' dequantizes and other nodes that read no input: computed once (each interpreter's own)
    sim_constants = ConstantNodes(q_fn.graph) if q_fn is not None else None
    sim_state = BatchState()
    inputs = _inputs(report, seed, samples)
    kept_runs: dict[Any, Any] = {}  # each partition's every-tensor reference run (litert_run.keeping)
    parsed_payloads: dict[int, Any] = {}  # each delegate's payload and value map (exact_pass.litert_values)
    # torch's references of every sample, on a thread beside the sample loop (``beside``)
    references = Beside(partial(_references, program, float_ep, q_fn, inputs))
    sample_outs: list[list[Any]] = []
    fast = 0

    def forced_checks(calls: list[Any], values: HostInt8Values, batch: Any, record: dict[str, Any]) -> None:
        """Teacher-forced, op by op: names any value off (op, index, values)."""
        nonlocal template, start
        sample_ops: list[OpParity] = []
        for lowered, args in calls:
            sample_ops.extend(op_parity(lowered, args, record=record))  # the device's arithmetic
        ops.extend(sample_ops)
        start = steps.add("samples: NPU ops against their references", start) + start
        if q_fn is not None:
            sample_ops += (sample_cpu := values.compare(q_fn, batch))
            cpu_ops.extend(sample_cpu)
            start = steps.add("samples: CPU ops against their references", start) + start
            if template is None:
                template = sample_ops

    chunk = chunk_size(q_fn) if q_fn is not None else 1

    def program_runs(index: int) -> tuple[list[Any], HostInt8Values, Any, Any, dict[str, Any] | None]:
        """Sample ``index``'s runs of the program (on the thread ahead of the loop, ``ahead``):
        its delegate calls, host int8 values, outputs with the device's kernels and with the
        user's, and LiteRT's int8 values where the sample is not teacher-forced (None: not read)."""
        batch = inputs[index]
        # The device's arithmetic (LiteRT reference kernels, the Cortex-M kernels): what the
        # per-op gates and the simulation judge; the user's kernels for the end-to-end figures.
        calls: list[Any] = []
        values = HostInt8Values(aliases)
        with litert_run.keeping(DEVICE_KERNELS, kept_runs):  # its every-tensor run feeds litert_values
            with recording(index):
                device_outs = run_program(program, batch, DEVICE_KERNELS, calls, values)
        if kernels == "reference" or not calls:
            outs = device_outs
        else:
            with recording(index):
                outs = run_program(program, batch, kernels)
        npu_values = None
        if index > 0 and q_fn is not None:  # judged from the simulation: read now (the next run replaces it)
            with litert_run.keeping(DEVICE_KERNELS, kept_runs):
                npu_values = exact_pass.litert_values(calls, parsed_payloads)
        return calls, values, device_outs, outs, npu_values

    # each sample's runs on a thread up to a chunk ahead of the loop (``ahead``); a run cut
    # short there is recorded again here
    ahead = Ahead(program_runs, samples, chunk, undo=memo.forget if memo is not None else None)
    try:
        for first in range(0, samples, chunk):
            runs: list[tuple[Any, ...]] = []
            for index in range(first, min(first + chunk, samples)):
                batch = inputs[index]
                steps.status(f"sample {index + 1}/{samples}: running the program, each op against its reference, "
                             "the device simulation")  # fmt: skip
                start = time.perf_counter()
                calls, values, device_outs, outs, npu_values = ahead.take(index)  # waits for the thread
                if index < FLOAT_CHECK_SAMPLES:  # the float check's partition inputs (``float_partitions``)
                    float_calls.append(list(calls))
                if edge_outputs is not None:  # the .pte interpreter is compared with them (``verify``)
                    edge_outputs.append(outs)
                start = steps.add("samples: the program's runs", start) + start
                # the first sample: teacher-forced, the others' template (set only with q_fn,
                # so past the first sample ``program_runs`` has read LiteRT's values)
                forced = template is None
                if forced:
                    npu_values = {}
                    forced_checks(calls, values, batch, npu_values)
                runs.append((batch, calls, values, device_outs, outs, npu_values, forced))
            sims: list[Any] = [(None, {})] * len(runs)
            if q_fn is not None:  # the chunk's device simulation: one pass (``sample_pass``)
                start = time.perf_counter()
                sims = simulations(
                    q_fn,
                    [r[0] for r in runs],
                    [r[2].kinds(q_fn) for r in runs],
                    [{**r[5], **r[2].values(q_fn)} for r in runs],
                    sim_constants,
                    sim_state,
                )
                start = steps.add("samples: the device simulation", start) + start
            for (batch, calls, values, device_outs, outs, npu_values, forced), (sim, seen) in zip(
                runs, sims, strict=True
            ):
                start = time.perf_counter()
                if not forced and q_fn is not None:  # one pass where it proves the per-op gates
                    judged = exact_pass.judged(template, npu_values, values.values(q_fn), seen)
                    if judged is not None:
                        fast += 1
                        ops.extend(p for p in judged if p.partition != "cpu")
                        cpu_ops.extend(p for p in judged if p.partition == "cpu")
                        start = steps.add("samples: the device simulation", start) + start
                    else:
                        forced_checks(calls, values, batch, {})
                if sim is not None:
                    sim_worst = max(sim_worst, _simulation_steps(program, sim.raw, device_outs, scales))
                    sim_not_exact.update(sim.not_exact)
                    sim_unforced.update(sim.unforced)
                    start = steps.add("samples: the device simulation", start) + start
                sample_outs.append(outs)
                # A sample's interpreters (LiteRT with every tensor preserved, the fx interpreters
                # around them) sit in reference cycles; the CLI's collector runs young collections
                # rarely (process_memory), and 32 samples of vgg11_bn's then held 22 GB.
                gc.collect(1)
    finally:
        ahead.close()
    start = time.perf_counter()
    steps.status(f"torch's references of {samples} samples (float, float32, float64)")
    exact_all, float_all, q_all, sums = references.result()
    steps.add("samples: torch's references (float, float32, float64)", start)
    for outs, flat_f, flat_q, flat_exact in zip(sample_outs, float_all, q_all, exact_all, strict=True):
        check.add(outs, flat_exact)
        if check.primary is None:  # no float output: the leaves' own checks are all there is
            continue
        p = check.primary
        ours, ref_f, ref_q, exact = outs[p].float(), flat_f[p], flat_q[p], flat_exact[p]
        scale = scales[p]
        max_abs_f = max(max_abs_f, float((ours - ref_f).abs().max()))
        if scale:
            off = (ours - ref_q).abs() / scale
            worst = max(worst, float(off.max()))
            total += float(off.sum())
            count += off.numel()
            spread = max(spread, float((ref_q - exact).abs().max()) / scale)
            vs_exact = max(vs_exact, float((ours - exact).abs().max()) / scale)
        top1_spread += int(top1_agrees(ref_q, exact))
        top1_exact += int(top1_agrees(ours, exact))
        top1_q += int(top1_agrees(ours, ref_q))
        top1_f += int(top1_agrees(ours, ref_f))
    on_npu = all(n["placement"] == "npu" for n in report["nodes"]) and bool(report["nodes"])
    scale = leaf_scales(program)[check.primary] if check.primary is not None else None
    result = Verification(
        samples=samples,
        max_steps=worst if scale else None,
        mean_steps=(total / count) if count else None,
        top1_vs_quantized=top1_q if check.primary is not None else None,
        top1_vs_float=top1_f if check.primary is not None else None,
        max_abs_vs_float=max_abs_f,
        whole_model_on_npu=on_npu,
    )
    result.outputs = [leaf.as_dict() for leaf in check.leaves]
    result.reference_integer_sums = len(sums.taken)
    result.reference_float64_sums = dict(sorted(sums.left.items()))
    if sums.left:
        first = next(iter(result.reference_float64_sums.items()))
        result.notes.append(
            f"float64 reference: {len(sums.left)} of {len(sums.left) + len(sums.taken)} convs / linears summed "
            f"by torch's float64 op, not as integers ({first[0]}: {first[1]}; --json lists them)"
        )
    result.samples_from_simulation = fast
    result.references_computed_in = references.where
    if references.failed:
        result.notes.append(f"torch's references were computed in {references.where}")
    result.program_runs_in = ahead.where
    if ahead.failed:
        result.notes.append(
            f"the program's runs from sample {ahead.failed_at + 1} on were computed in {ahead.where}"
        )
    result.sim_batched_samples, result.sim_batched_passes = sim_state.samples, sim_state.passes
    result.sim_per_sample_nodes = dict(sim_state.per_sample)
    if sim_state.note:
        result.notes.append(sim_state.note)
    result.notes.extend(deferred_imports.take_reload_notes())
    if q_fn is not None and check.primary is not None:
        result.reference_spread_top1, result.top1_vs_exact = top1_spread, top1_exact
    if scale and q_fn is not None:
        result.reference_spread_steps, result.max_steps_vs_exact = spread, vs_exact
    _gate_ops(result, ops, cpu_ops)
    if steps.finished is not None:
        compared = (
            f"{result.op_values:,} NPU and {result.cpu_values:,} CPU int8 values against their references"
            + (", every output value against the device simulation" if q_fn is not None else "")
        )
        how = f"; {fast} of them judged op by op from the simulation's one pass" if fast else ""
        steps.finished(f"ran {samples} samples{how}: {compared} ({time.perf_counter() - loop_start:.1f} s)")
    _float_check(result, float_ep, report, samples, seed, steps, float_calls)
    if q_fn is not None and any(scales):
        _gate_simulation(result, sim_worst, sim_not_exact, sim_unforced)
    need = result.top1_required = min_top1 if min_top1 is not None else top1_required(samples)
    agree, against = (
        (top1_exact, "the quantized reference (exact value)")
        if q_fn is not None
        else (top1_f, "the float model")
    )
    result.failures += check.failures(need, against, max_steps, skip=check.primary)
    same = report.get("float_equivalence") or {}
    if same.get("passed") is False:  # the references below are the edited model's, not the user's
        result.failures.insert(
            0,
            f"the compiled model does not compute the exported model: {same.get('why')} (compile's float check)",
        )
    if check.primary is not None:
        if not check.leaves[check.primary].top1:
            result.top1_required = 0  # one value per row: nothing for top-1 to disagree on
        _gate_top1(result, agree, result.top1_required, against, min_top1, bool(ops or cpu_ops))
    if max_steps is not None and scale and q_fn is not None and vs_exact > max_steps:
        result.failures.append(
            f"max difference from the quantized reference (exact value) {vs_exact:.1f} steps > {max_steps:g}"
        )
    if data is not None:
        with steps.step("accuracy", f"measuring the accuracy on {data.source}") as done:
            _gate_accuracy(result, program, float_ep, data, report, kernels, max_accuracy_drop)
            done["line"] = (
                f"accuracy on {data.source}: {result.data_samples} labeled samples, float vs compiled"
            )
    return result


def _simulation_steps(
    program: ExportedProgram, simulated: Any, device_outs: list[Any], scales: list[float | None]
) -> float:
    """The device run's worst distance from the simulation over every value of every
    dequantized output, in steps."""
    sim_flat = flatten(program, simulated)
    worst = 0.0
    for leaf, scale in enumerate(scales):
        if scale and leaf < len(sim_flat) and isinstance(sim_flat[leaf], torch.Tensor):
            worst = max(worst, output_steps(device_outs[leaf].float(), sim_flat[leaf].float(), scale))
    return worst


def _gate_ops(result: Verification, ops: list[OpParity], cpu_ops: list[OpParity]) -> None:
    """The per-op figures, summed over the samples, and their gates (NPU, then CPU ops)."""
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
        _gate_npu_ops(result, npu_ops)
    _gate_cpu_ops(result, cpu_summary)


def _gate_top1(
    result: Verification, agree: int, need: int, against: str, min_top1: int | None, any_ops: bool
) -> None:
    """Top-1 agreement on the primary output (``need`` of the samples): a gate, or a reported
    figure when the output equals its device simulation and the user asked for no minimum."""
    samples = result.samples
    if agree >= need:
        return
    if result.sim_exact and min_top1 is None:  # a top-1 minimum the user asks for is a gate
        # The program computes the quantized model in the device's arithmetic, every value:
        # top-1 against torch's evaluation then measures how the network amplifies the
        # rounding both sides do differently (random weights amplify it most), not an error.
        result.notes.append(
            f"top-1 agreement with {against} {agree}/{samples} (< {need}: reported, not gated): the "
            "output equals the whole program simulated in the device's arithmetic, every value"
        )
        return
    every_op_close = max(result.op_max_steps or 0, result.cpu_op_max_steps or 0) <= OP_MAX_STEPS
    why = (
        f" (every op is within {OP_MAX_STEPS} step of its reference op on the same inputs: the "
        "network amplifies the kernels' rounding, not a conversion error)"
        if every_op_close and any_ops
        else ""
    )
    result.failures.append(f"top-1 agreement with {against} {agree}/{samples} < {need}/{samples}{why}")


def _gate_accuracy(
    result: Verification,
    program: ExportedProgram,
    float_ep: ExportedProgram,
    data: Labeled,
    report: dict[str, Any],
    kernels: str,
    max_accuracy_drop: float,
) -> None:
    """Top-1 accuracy on labeled data, compiled vs float: the drop within ``max_accuracy_drop``."""
    acc = evaluate(program, float_ep, data, report, kernels)
    result.data, result.data_samples = data.source, acc.samples
    result.float_accuracy, result.compiled_accuracy = acc.float_accuracy, acc.compiled_accuracy
    result.accuracy_drop, result.max_accuracy_drop = acc.drop, max_accuracy_drop
    if acc.drop > max_accuracy_drop:
        result.failures.append(
            f"accuracy on {data.source} ({acc.samples} samples): compiled {acc.compiled_accuracy:.2f}% vs "
            f"float {acc.float_accuracy:.2f}%, a drop of {acc.drop:.2f} points > {max_accuracy_drop:g}"
        )


def _gate_npu_ops(result: Verification, npu_ops: list[dict[str, Any]]) -> None:
    """Each NPU op equals its device-exact reference; ops without one keep the <= 1 step rule
    and are listed (``not_exact``)."""
    exact = [o for o in npu_ops if o["device_exact"]]
    result.exact_values = sum(o["values"] for o in exact)
    result.exact_values_off = sum(o["values_off"] for o in exact)
    for o in exact:
        if o["values_off"] > EXACT_VALUES_OFF:
            result.failures.append(
                f"NPU op {o['partition']}:{o['node']} has {o['values_off']:,} of {o['values']:,} values off its "
                f"device-exact reference (max {o['max_steps']} steps; first at {o['first_off']}): the "
                "reference computes the Edge op in the device's integer arithmetic, so this is a conversion error"
            )
    for o in npu_ops:
        if o["device_exact"]:
            continue
        result.not_exact.append({"partition": o["partition"], "node": o["node"], "reason": o["reason"]})
        name = f"{o['partition']}:{o['node']}"
        if o["max_steps"] > OP_MAX_STEPS:
            result.failures.append(
                f"NPU op {name} is {o['max_steps']} steps from the reference op on the same inputs "
                f"(> {OP_MAX_STEPS}; no device-exact rule: {o['reason']}): a conversion error"
            )
        allowed = off_by_one_allowed(o["values"], "reference")
        if o["off_by_one"] > allowed:
            result.failures.append(
                f"NPU op {name} has {o['off_by_one']:,} of {o['values']:,} values one step off the reference op "
                f"on the same inputs (> {allowed:,}: {OFF_BY_ONE_MAX_FRACTION['reference']:.1%}; no device-exact "
                f"rule: {o['reason']}): a wrong constant, not rounding"
            )


def _gate_cpu_ops(result: Verification, cpu_ops: list[dict[str, Any]]) -> None:
    """Each CPU op equals its reference on the host's inputs (CMSIS-NN arithmetic for Cortex-M
    ops, torch's dequantize / op / quantize for portable ones); an op without an exact
    reference stays within ``CPU_OP_MAX_STEPS`` of torch's op and is listed (``cpu_not_exact``)."""
    for o in cpu_ops:
        if o["device_exact"]:
            if o["values_off"] > CPU_EXACT_VALUES_OFF:
                result.failures.append(
                    f"CPU op {o['node']} has {o['values_off']:,} of {o['values']:,} values off its reference "
                    f"on the same inputs (max {o['max_steps']} steps; first at {o['first_off']}): the reference "
                    "computes the quantized op in the CPU kernel's arithmetic, so this is a lowering or kernel error"
                )
            continue
        result.cpu_not_exact.append({"node": o["node"], "reason": o["reason"]})
        result.notes.append(
            f"CPU op {o['node']}: no exact reference ({o['reason']}); compared with torch's op "
            f"(<= {CPU_OP_MAX_STEPS} step): {o['max_steps']} step(s)"
        )
        if o["max_steps"] > CPU_OP_MAX_STEPS:
            result.failures.append(
                f"CPU op {o['node']} is {o['max_steps']} steps from the reference op on the same inputs "
                f"(> {CPU_OP_MAX_STEPS}; no exact reference: {o['reason']}; {o['values_off']:,} of "
                f"{o['values']:,} values off, first at {o['first_off']}): a lowering or kernel error"
            )


#: Samples the float check runs (each op's float form is deterministic arithmetic: a few
#: inputs cover its range; more only cost time).
FLOAT_CHECK_SAMPLES = 4


def _float_check(
    result: Verification,
    float_ep: ExportedProgram,
    report: dict[str, Any],
    samples: int,
    seed: int,
    steps: Steps,
    calls: list[list[Any]] | None = None,
) -> None:
    """Every NPU converter in float form against the float Edge ops (``runtime.verification.float_check``):
    on the compiled program's own partitions in float (``runtime.verification.float_partitions``,
    ``calls``: the delegate calls of the first samples), else on ``float.pt2`` lowered again (told)."""
    from etforge.runtime.verification import float_check

    reg = registry()
    target = reg.target(report["target"])
    if target.npu is None:
        return
    float_target = float_check.float_target(target)
    if calls:
        doing = f"float check: the NPU partitions in float32 on {len(calls)} samples"
        with steps.step("float check", doing) as done:
            ops, why = _float_check_in_place(calls, float_target, reg)
            if ops is not None:
                done["line"] = (
                    f"float check: {len(ops)} NPU ops of the compiled partitions in float32 against the "
                    f"float Edge ops, {len(calls)} samples"
                )
        if ops is not None:
            result.float_check_source = "partitions"
            _float_failures(result, ops)
            return
        result.notes.append(f"float check: lowered {output.FLOAT_PROGRAM} again: {why}")
    options = {k: tuple(v) if isinstance(v, list) else v for k, v in report["options"].items()}
    batches = _inputs(report, seed, min(samples, FLOAT_CHECK_SAMPLES))
    doing = f"float check: lowering {output.FLOAT_PROGRAM}, NPU ops in float32 on {len(batches)} samples"
    unfolded: list[str] = []
    with steps.step("float check", doing) as done:
        ops = float_check.check_float_program(float_ep, target, options, reg, batches, unfolded)
        done["line"] = (
            f"float check: {len(ops)} NPU ops in float32 against the float Edge ops, {len(batches)} samples"
            + (f" (BatchNorms not folded: {unfolded[0]})" if unfolded else "")
        )
    result.float_check_source = output.FLOAT_PROGRAM
    if unfolded:
        result.float_check_unfolded = unfolded[0]
        result.notes.append(
            f"float check ran on the unfolded float program: {unfolded[0]}; each BatchNorm stays a "
            "float CPU op and the NPU ops around it are checked as before (slower, as strong)"
        )
    _float_failures(result, ops)


def _float_check_in_place(calls: list[list[Any]], target: Any, reg: Registry) -> tuple[list[Any] | None, str]:
    """(each NPU op's worst float check over ``calls``, "") — or (None, why) where a partition
    cannot be checked in float in place (then ``float.pt2`` is lowered as before)."""
    from etforge.runtime.verification.float_check import FloatOp, float_op_check
    from etforge.runtime.verification.float_partitions import NotStrippable, float_partition

    partitions: dict[int, Any] = {}
    worst: dict[tuple[str, str], FloatOp] = {}
    for sample in calls:
        for lowered, args in sample:
            if id(lowered) not in partitions:
                try:
                    partitions[id(lowered)] = float_partition(lowered, target, reg)
                except (NotStrippable, EtforgeError) as exc:
                    return None, f"a partition could not be checked in float in place ({exc})"
                except Exception as exc:  # a converter that fails on float input: the old path, told
                    return None, f"converting a partition in float failed ({type(exc).__name__}: {exc})"
            part = partitions[id(lowered)]
            for f in float_op_check(part, part.inputs(args)):
                key = (f.partition, f.node)
                if key not in worst or f.rel_error > worst[key].rel_error:
                    worst[key] = f
    return list(worst.values()), ""


def _float_failures(result: Verification, ops: list[Any]) -> None:
    from etforge.runtime.verification import float_check

    result.float_ops = len(ops)
    result.float_max_rel = max((o.rel_error for o in ops), default=None)
    result.failures.extend(float_check.failures(ops))


def _gate_simulation(
    result: Verification, worst: float, not_exact: dict[str, str], unforced: dict[str, str]
) -> None:
    """Every value of every dequantized output equals the device-arithmetic simulation
    (``runtime.verification.simulate``); within ``SIM_MAX_STEPS`` only where a value without a rule could
    not be taken from the program (listed)."""
    result.sim_max_steps = worst
    result.sim_not_exact = sorted(not_exact)
    result.sim_unforced = sorted(unforced)
    bound = float(SIM_MAX_STEPS) if unforced else 0.0
    result.sim_exact = worst == 0.0 and not unforced
    if worst > bound:
        why = (
            f"{len(unforced)} values without a device-exact rule simulated by torch: {', '.join(sorted(unforced)[:4])}"
            if unforced
            else "every value follows the device's arithmetic or is the program's own within one step"
        )
        result.failures.append(
            f"the output is {worst:.1f} steps from the whole program simulated in the device's arithmetic "
            f"(> {bound:g}: {why}): the compiled program does not compute the quantized model"
        )
