"""Benchmark: what loading a compile's three programs costs verify, against the plain deserializers.

Run: .venv/bin/python bench/load_cost.py [--model zoo:mobilenet_v2_96] [--target imxrt700cm]
                                         [--out OUT] [--rounds 6]

``verify``'s rebuild step loads ``float.pt2`` and ``quantized.pt2`` (``core.front.load.load_program``)
and ``lowered_edge.exir`` (``core.serialize.lowered_program.load_lowered``). Here, in one process
(imports warm, the ``etforge`` command's collector settings, the CPU libraries' operators
registered first as verify does), the three loads run ``--rounds`` times, alternating with
torch's ``torch.export.load`` and ExecuTorch's ``executorch.exir.serde`` deserializer called
plainly on the same files. Printed: CPU seconds of each way per round, their medians and
etforge ÷ plain (etforge's loads do more: tensors-only unpickling, the annotations of the
saved program, and its reflection shim ``core.front.serde_once`` makes them cheaper). ``--out``:
an existing output directory instead of compiling ``--model`` for ``--target`` first.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any


def _plain(out: Path) -> None:
    import torch
    from executorch.exir.serde.export_serialize import SerializedArtifact
    from executorch.exir.serde.serialize import deserialize

    from etforge.core.serialize import lowered_program as lp

    for name in ("float.pt2", "quantized.pt2"):
        torch.export.load(out / name)
    with zipfile.ZipFile(out / "lowered_edge.exir") as archive:
        read = [archive.read(n) for n in (lp._PROGRAM, lp._STATE, lp._CONSTANTS, lp._EXAMPLES)]
    deserialize(SerializedArtifact(*read))


def _etforge(out: Path) -> None:
    from etforge.core.front.load import load_program
    from etforge.core.serialize.lowered_program import load_lowered

    load_program(out / "float.pt2")
    load_program(out / "quantized.pt2")
    load_lowered(out / "lowered_edge.exir")


def _cpu(fn: Any, out: Path) -> float:
    start = time.process_time()
    fn(out)
    return time.process_time() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="zoo:mobilenet_v2_96")
    ap.add_argument("--target", default="imxrt700cm")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = args.out
        if out is None:
            out = Path(tmp) / "out"
            cmd = [
                sys.executable,
                "-m",
                "etforge",
                "compile",
                args.model,
                "--target",
                args.target,
                "-o",
                str(out),
            ]
            subprocess.run(cmd, check=True, capture_output=True)
        from etforge.core.common import process_memory
        from etforge.runtime.execution.cpu_libraries import host_libraries

        process_memory.tune_collector()
        host_libraries()
        _plain(out)  # first loads: lazy imports and caches, not counted
        _etforge(out)
        times: dict[str, list[float]] = {"etforge": [], "plain": []}
        for _ in range(args.rounds):
            times["etforge"].append(_cpu(_etforge, out))
            times["plain"].append(_cpu(_plain, out))
        for way, seconds in times.items():
            print(
                f"{way:8s} CPU s: {' '.join(f'{s:.3f}' for s in seconds)}  median {statistics.median(seconds):.3f}"
            )
        ratio = statistics.median(times["etforge"]) / statistics.median(times["plain"])
        print(f"etforge / plain (median CPU, the three loads of {out.name}): {ratio:.2f}")


if __name__ == "__main__":
    main()
