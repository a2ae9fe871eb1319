"""Benchmark: planned arena vs the lower bound (peak live bytes) per zoo model and target.

Run: .venv/bin/python bench/memory.py [--models ...] [--targets ...]
etforge plans with ExecuTorch's planning suite choosing between its ``greedy`` and etforge's
``best_fit`` (core/serialize/memory_plan.py); "greedy B" is ExecuTorch's default plan of the same
program, for comparison. Goal: arena <= 1.05 x lower bound.
"""

from __future__ import annotations

import argparse

import torch
from executorch.exir import EdgeProgramManager

from etforge import zoo
from etforge.core.build import pipeline
from etforge.core.build.session import compile_model
from etforge.core.serialize.memory import memory_stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(zoo.ZOO))
    parser.add_argument("--targets", default="imxrt700,imxrt700cm,cortex-m33")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(
        f"{'model':>18} {'target':>11} {'arena B':>10} {'lower bound':>12} {'ratio':>6} {'greedy B':>10} {'vs greedy':>9} {'scratch B':>10} {'const B':>10} {'NPU B':>10}"
    )
    for name in args.models.split(","):
        for target in args.targets.split(","):
            model, example = zoo.build(name)
            result = compile_model(model, example, target, calibration=zoo.calibration(name, 4))
            s = memory_stats(result.executorch)
            default = EdgeProgramManager(
                {"forward": pipeline.clone_program(result.host_program)},
                compile_config=result.edge.compile_config,
            ).to_executorch()
            greedy = sum(default.executorch_program.execution_plan[0].non_const_buffer_sizes[1:])
            arena = sum(s.arena_bytes)
            print(
                f"{name:>18} {target:>11} {arena:>10,} {s.lower_bound:>12,} {s.ratio:>6.3f} "
                f"{greedy:>10,} {arena / greedy if greedy else 1:>9.3f} "
                f"{sum(x['bytes'] for x in s.scratch):>10,} {s.constant_bytes:>10,} {s.delegate_bytes:>10,}",
                flush=True,
            )


if __name__ == "__main__":
    main()
