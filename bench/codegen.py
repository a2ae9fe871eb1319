"""Benchmark/sweep: codegen for every zoo model and target; registered == the .pte's operators.

Run: .venv/bin/python bench/codegen.py [--models ...] [--targets ...]
Prints, per model and target, the registered operator count per kernel library, whether it
equals the set ExecuTorch's own reader finds in the .pte, and the codegen time.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from executorch.codegen.tools.selective_build import _get_program_from_buffer, _get_program_operators

from etforge import zoo
from etforge.codegen import generate
from etforge.core.build.session import compile_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(zoo.ZOO))
    parser.add_argument("--targets", default="imxrt700,imxrt700cm,cortex-m33")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for name in args.models.split(","):
        for target in args.targets.split(","):
            model, example = zoo.build(name)
            result = compile_model(model, example, target, calibration=zoo.calibration(name, 2))
            with tempfile.TemporaryDirectory() as tmp:
                pte = Path(tmp) / "model.pte"
                pte.write_bytes(result.pte)
                start = time.perf_counter()
                gen = generate(pte, Path(tmp) / "gen")
                seconds = time.perf_counter() - start
            independent = set(_get_program_operators(_get_program_from_buffer(result.pte)))
            libs = ", ".join(f"{lib} {n}/{total}" for lib, (n, total) in gen.per_library.items() if n)
            same = (
                "equal"
                if set(gen.registered) == independent
                else f"DIFFERENT {sorted(independent ^ set(gen.registered))}"
            )
            print(
                f"{name:>18} {target:>11} {len(gen.registered):>3} ops ({libs}) {same} {seconds:.2f}s",
                flush=True,
            )


if __name__ == "__main__":
    main()
