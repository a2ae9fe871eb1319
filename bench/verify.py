"""Benchmark: int8 parity per zoo model and target (the numbers behind ``etforge verify``).

Run: .venv/bin/python bench/verify.py [--models ...] [--targets ...] [--samples 32]
Per model and target: max/mean |ours - PT2E quantized reference| in output quantization
steps, top-1 agreement with the quantized reference and with the float model, on seeded
inputs; NPU partitions run in LiteRT, Cortex-M ops as their reference implementations.
"""

from __future__ import annotations

import argparse

import torch

from etforge import zoo
from etforge.core.compiler import compile_model
from etforge.core.plugin_manager import registry
from etforge.core.report import build_report
from etforge.runtime.verify import compare


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(n for n in zoo.ZOO if n != "mobilenet_v2"))
    parser.add_argument("--targets", default="imxrt700,imxrt700cm,cortex-m33")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--calibration", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    reg = registry()
    print(
        f"{'model':>18} {'target':>11} {'max steps':>9} {'mean':>7} {'top-1 q':>8} {'top-1 f':>8} {'all NPU':>7}"
    )
    for name in args.models.split(","):
        for target in args.targets.split(","):
            model, example = zoo.build(name)
            calib = zoo.calibration(name, args.calibration)
            result = compile_model(model, example, target, calibration=calib, reg=reg)
            report = build_report(result, reg, name)
            for kernels in ("default", "reference") if result.partitions else ("default",):
                v = compare(
                    result.host_program,
                    result.float_program,
                    result.quantized_program,
                    report,
                    samples=args.samples,
                    kernels=kernels,
                )
                print(
                    f"{name:>18} {target:>11} {kernels:>9} {v.max_steps or 0:>9.1f} {v.mean_steps or 0:>7.3f} "
                    f"{v.top1_vs_quantized:>4}/{args.samples:<3} {v.top1_vs_float:>4}/{args.samples:<3} "
                    f"{'yes' if v.whole_model_on_npu else 'no':>7} "
                    f"{'-' if v.op_max_steps is None else v.op_max_steps:>8} "
                    f"{v.op_values_off:>6}/{v.op_values:<7} "
                    f"{'-' if v.cpu_op_max_steps is None else v.cpu_op_max_steps:>6} "
                    f"{'pass' if v.ok else 'FAIL':>6}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
