"""Benchmark: int8 parity per zoo model and target (the numbers behind ``etforge verify``).

Run: .venv/bin/python bench/verify.py [--models ...] [--targets ...] [--samples 32]
     .venv/bin/python bench/verify.py --speed [--models mobilenet_v2_96] [--samples 4]
     .venv/bin/python bench/verify.py --cost [--busy] [--seconds-goal FILE.py:factory] [...]
     (bench/verify_cost.py: verify ÷ compile and the other issue-47 goals, each printed as met or not)
``--speed``: per cortex-m33 model, the time per sample of verify's host reference path (the
``model.pte`` interpreter plus the lowered Edge program, both running every ``cortex_m`` op) with
etforge's CMSIS-NN-exact kernels and with ExecuTorch's Python reference implementations (what
verify ran before), on the same inputs in this one run, single-threaded; CPU seconds (the
machine's load does not inflate them) and wall seconds; the ratio; and whether the two kernel
sets agree on the outputs (they differ where ExecuTorch's references round unlike the device).
Per model and target: max/mean |ours - PT2E quantized reference| in output quantization
steps, top-1 agreement with the quantized reference and with the float model, on seeded
inputs; NPU partitions run in LiteRT, Cortex-M ops as their reference implementations.
"ref f32~f64" and "ref top-1": the PT2E program evaluated in float32 (as torch does) against
the same program in float64 (its exact value) — the reference's own precision; "vs f64" and
"top-1 f64": ours against that exact value (what verify's top-1 gate counts). ``--models`` takes ``mobilenet_v2`` (224×224, 1,000 classes) too.
"1-off": the NPU op with the largest share of values exactly one step off (the gate: 0.1% with
the default kernels); "skipped": values the per-op check could not compare. For the trained
zoo models (digits_*): top-1 accuracy of the float model and of the compiled program on the
held-out test split, and the drop in points (the gate: 1.0). "pte=edge": samples on which the
serialized ``model.pte``, run by the host interpreter at its planned offsets, computes exactly
what the lowered Edge program computes (verify requires all).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import torch

from etforge import zoo
from etforge.core.build.report import build_report
from etforge.core.build.session import compile_model
from etforge.core.registry.manager import registry
from etforge.runtime.execution import pte_ops
from etforge.runtime.execution.host import run_program
from etforge.runtime.execution.pte_interpreter import PteInterpreter
from etforge.runtime.verification.accuracy import load_labeled
from etforge.runtime.verification.pte_agreement import compare_with_edge
from etforge.runtime.verification.verify import _inputs, compare
from etforge.zoo import digits


def main() -> None:
    if "--cost" in sys.argv:  # verify's cost against the compile's, as processes
        sys.argv.remove("--cost")
        from verify_cost import main as cost

        cost()
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(zoo.ZOO))
    parser.add_argument("--targets", default="imxrt700,imxrt700cm,cortex-m33")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--calibration", type=int, default=16)
    parser.add_argument("--speed", action="store_true", help="time the cortex-m33 reference path, old vs new")
    args = parser.parse_args()
    torch.set_num_threads(1)
    reg = registry()
    if args.speed:
        speed(
            args.models.split(",") if args.models != ",".join(zoo.ZOO) else ["mobilenet_v2_96"], args.samples
        )
        return
    print(
        f"{'model':>18} {'target':>11} {'kernels':>9} {'max steps':>9} {'mean':>7} {'top-1 q':>8} "
        f"{'top-1 f':>8} {'all NPU':>7} {'op steps':>8} {'op values off':>14} {'cpu op':>6} "
        f"{'ref f32~f64':>11} {'ref top-1':>9} {'vs f64':>6} {'top-1 f64':>9} {'1-off':>7} {'skipped':>7} "
        f"{'float acc':>9} {'int8 acc':>8} {'drop':>5} {'pte=edge':>8} {'verify':>6}"
    )
    for name in args.models.split(","):
        for target in args.targets.split(","):
            model, example = zoo.build(name)
            calib = zoo.calibration(name, args.calibration)
            result = compile_model(model, example, target, calibration=calib, reg=reg)
            report = build_report(result, reg, name)
            for kernels in ("default", "reference") if result.partitions else ("default",):
                edge_outputs: list = []
                v = compare(
                    result.host_program,
                    result.float_program,
                    result.quantized_program,
                    report,
                    samples=args.samples,
                    kernels=kernels,
                    data=load_labeled(f"zoo:{name}", report) if name in digits.CONFIGS else None,
                    edge_outputs=edge_outputs,
                )
                agreement = compare_with_edge(
                    PteInterpreter(result.pte),
                    result.host_program,
                    _inputs(report, 0, args.samples),
                    kernels,
                    edge_outputs,
                )
                npu = [o for o in v.ops if o["partition"] != "cpu" and o["values"]]
                one_off = max((o["off_by_one"] / o["values"] for o in npu), default=0.0)
                acc = (
                    f"{v.float_accuracy:>8.2f}% {v.compiled_accuracy:>7.2f}% {v.accuracy_drop:>5.2f}"
                    if v.float_accuracy is not None
                    else f"{'-':>9} {'-':>8} {'-':>5}"
                )
                print(
                    f"{name:>18} {target:>11} {kernels:>9} {v.max_steps or 0:>9.1f} {v.mean_steps or 0:>7.3f} "
                    f"{v.top1_vs_quantized:>4}/{args.samples:<3} {v.top1_vs_float:>4}/{args.samples:<3} "
                    f"{'yes' if v.whole_model_on_npu else 'no':>7} "
                    f"{'-' if v.op_max_steps is None else v.op_max_steps:>8} "
                    f"{v.op_values_off:>6}/{v.op_values:<7} "
                    f"{'-' if v.cpu_op_max_steps is None else v.cpu_op_max_steps:>6} "
                    f"{v.reference_spread_steps or 0:>11.1f} {v.reference_spread_top1 or 0:>5}/{args.samples:<3} "
                    f"{v.max_steps_vs_exact or 0:>6.1f} {v.top1_vs_exact or 0:>5}/{args.samples:<3} "
                    f"{one_off:>7.3%} {v.skipped_values:>7} {acc} "
                    f"{agreement.agreed:>4}/{agreement.samples:<3} "
                    f"{'pass' if v.ok and agreement.ok else 'FAIL':>6}",
                    flush=True,
                )


def _timed(fn: Any) -> tuple[Any, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.process_time() - cpu, time.perf_counter() - wall


def speed(models: list[str], samples: int) -> None:
    """Reference path per sample, etforge kernels vs ExecuTorch's Python references."""
    reg = registry()
    print(
        f"{'model':>18} {'samples':>7} {'new cpu s':>9} {'old cpu s':>9} {'ratio cpu':>9} "
        f"{'new wall s':>10} {'old wall s':>10} {'ratio wall':>10} {'outputs equal':>13}"
    )
    for name in models:
        model, example = zoo.build(name)
        result = compile_model(model, example, "cortex-m33", calibration=zoo.calibration(name, 16), reg=reg)
        report = build_report(result, reg, name)
        interp = PteInterpreter(result.pte)
        batches = _inputs(report, 0, samples)

        def path(
            batch: Any, interp: PteInterpreter = interp, program: Any = result.host_program
        ) -> list[Any]:
            return [*interp.run(list(batch)), *run_program(program, batch)]

        path(batches[0])  # warm both: first calls resolve kernels
        with pte_ops.executorch_references():
            path(batches[0])
        new_cpu = old_cpu = new_wall = old_wall = 0.0
        equal = 0
        for batch in batches:  # interleaved, so both see the same load
            ours, c, w = _timed(lambda b=batch: path(b))
            new_cpu, new_wall = new_cpu + c, new_wall + w
            with pte_ops.executorch_references():
                theirs, c, w = _timed(lambda b=batch: path(b))
            old_cpu, old_wall = old_cpu + c, old_wall + w
            equal += all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))
        n = len(batches)
        print(
            f"{name:>18} {n:>7} {new_cpu / n:>9.3f} {old_cpu / n:>9.3f} {old_cpu / new_cpu:>8.1f}x "
            f"{new_wall / n:>10.3f} {old_wall / n:>10.3f} {old_wall / new_wall:>9.1f}x {equal:>9}/{n:<3}",
            flush=True,
        )


if __name__ == "__main__":
    main()
