"""Benchmark: torchvision's families, whole process — ``etforge compile`` against the bare ExecuTorch flow.

Run: .venv/bin/python bench/realworld_process.py [--families ...] [--target cortex-m33]
                                                 [--resolution 96] [--repeat 1]

Issue 23's speed goal is stated on whole processes: each tool runs as its own process,
single-threaded (OMP_NUM_THREADS=1), imports included, on the same torchvision module and
calibration tensors (``tests/models/torchvision_families.py``, 8 seeded samples). The bare
flow is bench/bare_flow.py (export, PT2E with ExecuTorch's XNNPACK quantizer, a
partitioner-free ``to_edge_transform_and_lower``, ``to_executorch``, the ``.pte`` written);
etforge is ``etforge compile FILE.py:build --target T --no-cache -o OUT`` (report, partitions,
codegen inputs and ``.pte`` written). ``--repeat N`` alternates the three (ABC, CBA, ...) and keeps the
fastest of each. bench/realworld.py gives the in-process figures beside the rest of the table.

The floor column is a third process that does only what any flow from this model file to a
``.pte`` must do and the bare flow does too: start Python, import torch and ExecuTorch's
``exir``, run the model file (its imports: torchvision, which imports ``torch._dynamo``) and
one ``torch.export``. floor / bare is the lowest ratio any tool could reach on that model as
a process; the smaller the model, the closer it is to the bare flow's own time.

Each process is also measured in CPU seconds (user + system, its own and its waited-for
children's: etforge's forked ``.pt2`` writers included). On a machine other work loads, wall
time measures the scheduler as much as the tool; CPU seconds move far less, so the CPU
columns are the ones to read there (a writer that runs beside the compile on an idle second
core counts in CPU, not in wall).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from process import bench_env, measure_process  # noqa: E402  (bench/process.py)

TESTS = Path(__file__).resolve().parents[1] / "tests"
FAMILIES = (
    "mobilenet_v2,mobilenet_v3_small,mobilenet_v3_large,shufflenet_v2_x0_5,squeezenet1_1,"
    "resnet18,mnasnet0_5,efficientnet_b0,regnet_x_400mf,googlenet"
)

#: The model file both tools read: torchvision's family, built as the tests build it.
MODEL_FILE = """import sys
sys.path.insert(0, {tests!r})
from models.torchvision_families import build as _build


def build():
    return _build({family!r}, {resolution})
"""

BARE = str(Path(__file__).resolve().parent / "bare_flow.py")

#: What every flow's process must do before its own work: imports, the model, one export.
FLOOR = """import importlib.util, os, sys
import torch
import executorch.exir
spec = importlib.util.spec_from_file_location("model", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
model, example, _ = module.build()
torch.export.export(model, example, strict=False)
os._exit(0)
"""


def measure(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one child process."""
    wall, _, cpu = measure_process(argv, env)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=FAMILIES)
    parser.add_argument("--target", default="cortex-m33")
    parser.add_argument("--resolution", type=int, default=96)
    parser.add_argument(
        "--repeat", type=int, default=1, help="alternating runs of each tool; the fastest is kept"
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="etforge-realworld-"))
    env = bench_env(tmp)
    runs = "one run" if args.repeat <= 1 else f"fastest of {args.repeat} alternating runs"
    print(
        f"torchvision families on {args.target}, {args.resolution}x{args.resolution}, whole processes, {runs}"
    )
    print(
        "| family | bare ExecuTorch process s | etforge compile process s | ratio | floor s | floor ratio "
        "| bare CPU s | etforge CPU s | CPU ratio | floor CPU ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for family in args.families.split(","):
        model = tmp / f"{family}.py"
        model.write_text(MODEL_FILE.format(tests=str(TESTS), family=family, resolution=args.resolution))
        bare_argv = [sys.executable, BARE, str(model), str(tmp / f"{family}-bare.pte")]
        etforge_argv = [
            *(sys.executable, "-m", "etforge", "compile", f"{model}:build", "--target", args.target),
            *("--no-cache", "-o", str(tmp / f"{family}-{args.target}")),
        ]
        tools = {
            "bare": bare_argv,
            "etforge": etforge_argv,
            "floor": [sys.executable, "-c", FLOOR, str(model)],
        }
        runs: dict[str, list[tuple[float, float]]] = {name: [] for name in tools}
        for i in range(max(1, args.repeat)):
            for name in tools if i % 2 == 0 else reversed(tools):  # ABBA: drift hits both alike
                runs[name].append(measure(tools[name], env))
        bare, ours, floor = (min(wall for wall, _ in runs[name]) for name in tools)
        bare_cpu, ours_cpu, floor_cpu = (min(cpu for _, cpu in runs[name]) for name in tools)
        print(
            f"| {family} | {bare:.1f} | {ours:.1f} | {ours / bare:.2f} | {floor:.1f} | {floor / bare:.2f} "
            f"| {bare_cpu:.1f} | {ours_cpu:.1f} | {ours_cpu / bare_cpu:.2f} | {floor_cpu / bare_cpu:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
