"""Benchmark: full compile per zoo model and target, and the lowering overhead ratio.

Run: .venv/bin/python bench/compile.py [--models cifarnet,resnet8] [--targets imxrt700,imxrt700cm,cortex-m33]
                                       [--no-process]

Per model and target: stage times, NPU MAC share, partitions, boundary transposes, arena
bytes; and two ratios measured in this one run (issue 17's goals, both <= 0.5):
- ``lower/bare``: etforge's lower stage over a bare ``to_edge_transform_and_lower`` (no
  partitioner, no extra passes) of the same quantized program. Both are timed ``--repeat``
  times, interleaved, and the fastest of each is used (one sample of a ~1 s stage varies by
  +-15 % here). NPU targets delegate early (``core/lower/early.py``); cortex-m33 has no NPU and
  lowers the classic way, so its ratio is ~1 by construction.
- ``proc/bare``: the whole ``etforge compile --no-cache`` process (imports, load, export,
  quantize, lower, serialize, write, codegen) over the bare ExecuTorch flow's process on the
  same module and calibration tensors (``bench/process.py``), with etforge's peak RSS.
Single-threaded torch; run nothing else meanwhile.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from executorch.exir import to_edge_transform_and_lower

from etforge import zoo
from etforge.core.build.pipeline import edge_config, lower
from etforge.core.build.report import build_report
from etforge.core.build.session import compile_model
from etforge.core.registry.manager import registry


def bare_lowering(program: torch.export.ExportedProgram) -> float:
    start = time.perf_counter()
    to_edge_transform_and_lower(program, compile_config=edge_config())
    return time.perf_counter() - start


def etforge_lowering(program: torch.export.ExportedProgram, target: object, options: dict) -> float:
    """etforge's lower stage (partition, convert, NPU compiler hook, CPU lowering) alone."""
    start = time.perf_counter()
    lower(program, target, options, registry())  # type: ignore[arg-type]
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(zoo.ZOO))
    parser.add_argument("--targets", default="imxrt700,imxrt700cm,cortex-m33")
    parser.add_argument("--calibration", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3, help="timings per lowering (fastest kept)")
    parser.add_argument("--no-process", action="store_true", help="skip the whole-process columns")
    args = parser.parse_args()
    import process  # bench/process.py, beside this file

    tmp = Path(tempfile.mkdtemp(prefix="etforge-bench-"))
    env = process.bench_env(tmp)
    torch.set_num_threads(1)
    reg = registry()
    cols = (
        "model",
        "target",
        "export",
        "quant",
        "lower",
        "serial",
        "NPU MAC %",
        "parts",
        "transp",
        "arena B",
        "bare s",
        "lower/bare",
        "proc s",
        "RSS MB",
        "proc/bare",
    )
    print(" ".join(f"{c:>10}" for c in cols))
    for name in args.models.split(","):
        bare_proc = None if args.no_process else process.bare_process(name, args.calibration, tmp, env)
        for target in args.targets.split(","):
            model, example = zoo.build(name)
            result = compile_model(
                model, example, target, calibration=zoo.calibration(name, args.calibration), reg=reg
            )
            report = build_report(result, reg, f"zoo:{name}")
            program = result.quantized_program
            assert program is not None
            bares, ours = [], [result.stage_seconds["lower"]]
            for i in range(args.repeat):
                bares.append(bare_lowering(program))
                if i:
                    ours.append(etforge_lowering(program, result.target, result.options))
            bare, lower = min(bares), min(ours)
            proc = ("-", "-", "-")
            if bare_proc is not None:
                wall, rss = process.etforge_process(name, target, args.calibration, tmp, env)
                proc = (f"{wall:.1f}", f"{rss:.0f}", f"{wall / bare_proc[0]:.2f}")
            s = result.stage_seconds
            row = (
                name,
                target,
                f"{s['export']:.2f}",
                f"{s['quantize']:.2f}",
                f"{lower:.2f}",
                f"{s['serialize']:.2f}",
                f"{100 * report['macs']['npu_share']:.1f}",
                str(len(report["partitions"])),
                str(sum(p["boundary_transposes"] for p in report["partitions"])),
                ",".join(str(b) for b in report["memory"]["arena_bytes"]),
                f"{bare:.2f}",
                f"{lower / bare:.2f}",
                *proc,
            )
            print(" ".join(f"{c:>10}" for c in row), flush=True)


if __name__ == "__main__":
    main()
