"""Benchmark: partitioning + LiteRT conversion alone, per zoo model (ops per second).

Run: .venv/bin/python bench/convert.py [--target litert] [--models cifarnet,resnet8]
Prints one row per model; times are measured in this run, single-threaded.
"""

from __future__ import annotations

import argparse
import time

import torch

from etforge import zoo
from etforge.core.build import pipeline
from etforge.core.registry.manager import registry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="imxrt700cm")
    parser.add_argument("--models", default=",".join(zoo.ZOO))
    parser.add_argument("--calibration", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    reg = registry()
    target = reg.target(args.target)
    print(f"target {target.name}; partition+convert measured inside to_edge_transform_and_lower")
    header = f"{'model':18} {'edge nodes':>10} {'NPU nodes':>9} {'LiteRT ops':>10} {'partition s':>11} {'convert s':>9} {'ops/s':>9} {'lower s':>8}"
    print(header)
    print("-" * len(header))
    for name in args.models.split(","):
        model, example = zoo.build(name)
        ep = pipeline.quantize(
            pipeline.export(model, example), target, zoo.calibration(name, args.calibration), reg
        )
        start = time.perf_counter()
        edge, partitioner, parts, _ = pipeline.lower(ep, target, None, reg)
        lower_s = time.perf_counter() - start
        convert_s = sum(p.converted.seconds for p in parts)
        ops = sum(len(p.converted.operators) for p in parts)
        npu = sum(d.npu for d in partitioner.decisions)
        total = partitioner.seconds + convert_s
        print(
            f"{name:18} {len(partitioner.decisions):>10} {npu:>9} {ops:>10} {partitioner.seconds:>11.3f} "
            f"{convert_s:>9.3f} {ops / total if total else 0:>9.0f} {lower_s:>8.2f}"
        )


if __name__ == "__main__":
    main()
