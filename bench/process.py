"""Benchmark: whole-process compile (imports included) against the bare ExecuTorch flow, and
an unchanged model's recompile from the build cache.

Run: .venv/bin/python bench/process.py [--model mobilenet_v2_96] [--target imxrt700] [--repeat N]

Each tool runs as its own process, one after another, single-threaded (OMP_NUM_THREADS=1),
on the same zoo module with the same 10 calibration samples; wall time and peak RSS per
process, and the ratios measured in this one run. The bare flow is what a user writes
without a backend: export, PT2E with ExecuTorch's XNNPACK quantizer, a partitioner-free
``to_edge_transform_and_lower``, ``to_executorch``. Goals (issue 17): etforge ≤ 0.5× the bare
flow, peak RSS ≤ 400 MB, a cached recompile ≤ 2 s; issue 48: ≤ 3 s in the default mode (a
``zoo:`` model is answered in direct mode; the same model behind a factory, also measured, by
the key of its exported program, after import, load and export).

``--litert-torch PYTHON`` adds a peer: litert-torch's PT2E int8 flow (its ``PT2EQuantizer``,
``litert_torch.convert``, a ``.tflite``) on the same module and calibration tensors, run by
PYTHON, an environment with ``litert-torch`` and etforge's zoo (``pip install litert-torch``
then ``pip install --no-deps pluggy -e .``; litert-torch pins its own stack, so it gets its
own venv). Every row is then also given against that peer.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

#: The bare flow as its own process (bench/bare_flow.py).
BARE = str(Path(__file__).resolve().parent / "bare_flow.py")

LITERT_TORCH = r"""
import sys, torch
from etforge.zoo import models
import litert_torch
from litert_torch.quantize.pt2e_quantizer import PT2EQuantizer, get_symmetric_quantization_config
from litert_torch.quantize.quant_config import QuantConfig
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
name, calib, out = sys.argv[1], sys.argv[2], sys.argv[3]
model, example = models.build(name)
quantizer = PT2EQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
gm = prepare_pt2e(torch.export.export(model, example, strict=False).module(), quantizer)
with torch.no_grad():
    for batch in torch.load(calib, weights_only=True):  # tensors only: never code from a file
        gm(*batch)
gm = convert_pt2e(gm, fold_quantize=False)
litert_torch.convert(gm, example, quant_config=QuantConfig(pt2e_quantizer=quantizer)).export(out)
"""

#: ``zoo:MODEL`` as a user's factory (``file.py:build``): answered by the exported program's key.
FACTORY = """
from etforge import zoo


def build():
    model, example = zoo.build("{model}")
    return model, example
"""

#: One child process: its exit code, wall seconds, peak RSS (KB) and CPU seconds (user + system
#: of it and of every descendant it waited for).
MEASURE = r"""
import resource, subprocess, sys, time
start = time.perf_counter()
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE).returncode
wall = time.perf_counter() - start
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(rc, wall, usage.ru_maxrss, usage.ru_utime + usage.ru_stime)
"""


def measure_process(argv: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """(wall seconds, peak RSS MB, CPU seconds) of one child process."""
    proc = subprocess.run(
        [sys.executable, "-c", MEASURE, *argv], capture_output=True, text=True, env=env, check=True
    )
    rc, wall, rss_kb, cpu = proc.stdout.split()
    if rc != "0":
        raise SystemExit(f"{argv[:4]} failed: {proc.stderr[-2000:]}")
    return float(wall), int(rss_kb) / 1024, float(cpu)


def measure(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MB) of one child process."""
    wall, rss, _ = measure_process(argv, env)
    return wall, rss


def bench_env(tmp: Path) -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "ETFORGE_CACHE_DIR": str(tmp / "cache"),
        "ETFORGE_NO_CACHE": "0",
    }


def calibration_file(model: str, count: int, tmp: Path, env: dict[str, str]) -> Path:
    """The zoo's calibration samples in a file, so both tools calibrate on the same tensors."""
    path = tmp / f"{model}-calib.pt"
    if not path.exists():
        code = (
            "import sys, torch; from etforge import zoo; "
            "torch.save(zoo.calibration(sys.argv[1], int(sys.argv[2])), sys.argv[3])"
        )
        subprocess.run([sys.executable, "-c", code, model, str(count), str(path)], check=True, env=env)
    return path


def bare_process(model: str, count: int, tmp: Path, env: dict[str, str]) -> tuple[float, float]:
    """(wall s, peak RSS MB) of the bare ExecuTorch flow as its own process."""
    return measure([sys.executable, BARE, f"zoo:{model}", str(count), str(tmp / f"{model}-bare.pte")], env)


def litert_torch_process(
    python: str, model: str, calib: Path, tmp: Path, env: dict[str, str]
) -> tuple[float, float]:
    """(wall s, peak RSS MB) of litert-torch's PT2E int8 flow as its own process."""
    return measure([python, "-c", LITERT_TORCH, model, str(calib), str(tmp / f"{model}.tflite")], env)


def etforge_argv(model: str, target: str, calib: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "etforge",
        "compile",
        f"zoo:{model}",
        "--target",
        target,
        "--calib",
        str(calib),
    ]


def etforge_process(
    model: str, target: str, count: int, tmp: Path, env: dict[str, str]
) -> tuple[float, float]:
    """(wall s, peak RSS MB) of ``etforge compile --no-cache`` as its own process."""
    out = tmp / f"{model}-{target}"
    argv = etforge_argv(model, target, calibration_file(model, count, tmp, env))
    return measure([*argv, "-o", str(out), "--no-cache"], env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mobilenet_v2_96")
    parser.add_argument("--target", default="imxrt700")
    parser.add_argument("--calibration", type=int, default=10)
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of each process, alternating bare and etforge (ABBA...); the fastest is kept, "
        "so a machine whose speed drifts during the run skews the ratio less",
    )
    parser.add_argument(
        "--litert-torch",
        metavar="PYTHON",
        help="also run litert-torch's PT2E int8 flow with this Python (see the module docstring)",
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="etforge-bench-"))
    env = bench_env(tmp)
    calib = calibration_file(args.model, args.calibration, tmp, env)
    etforge = etforge_argv(args.model, args.target, calib)
    tools = {
        "bare ExecuTorch flow": lambda: bare_process(args.model, args.calibration, tmp, env),
        "etforge compile (no cache)": lambda: measure([*etforge, "-o", str(tmp / "a"), "--no-cache"], env),
    }
    if args.litert_torch:
        tools["litert-torch (PT2E int8)"] = lambda: litert_torch_process(
            args.litert_torch, args.model, calib, tmp, env
        )
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in tools}
    for i in range(max(1, args.repeat)):
        for name in tools if i % 2 == 0 else reversed(tools):  # ABBA: drift hits every tool alike
            runs[name].append(tools[name]())
    rows = {name: min(r) for name, r in runs.items()}
    measure([*etforge, "-o", str(tmp / "b")], env)  # fills the cache
    rows["etforge compile (cached)"] = measure([*etforge, "-o", str(tmp / "c")], env)
    # The same model behind a factory: the default key is the exported program's (docs/batch.md).
    factory = tmp / "factory.py"
    factory.write_text(FACTORY.format(model=args.model))
    by_factory = [*etforge[:4], f"{factory}:build", *etforge[5:]]
    measure([*by_factory, "-o", str(tmp / "f1")], env)  # fills the cache
    rows["etforge compile factory (cached)"] = measure([*by_factory, "-o", str(tmp / "f2")], env)
    modes = {
        name: json.loads((tmp / d / "report.json").read_text())["cache"]["mode"]
        for name, d in (("zoo", "c"), ("factory", "f2"))
    }
    same = (tmp / "a" / "model.pte").read_bytes() == (tmp / "c" / "model.pte").read_bytes()
    bare_wall = rows["bare ExecuTorch flow"][0]
    runs = "one run" if args.repeat <= 1 else f"fastest of {args.repeat} alternating runs"
    print(f"{args.model} on {args.target}, {args.calibration} calibration samples, {runs}")
    peer = rows.get("litert-torch (PT2E int8)")
    head = f"{'process':<30} {'wall s':>8} {'peak RSS MB':>12} {'vs bare':>8}"
    print(head + (f" {'vs litert-torch':>16}" if peer else ""))
    for name, (wall, rss) in rows.items():
        line = f"{name:<30} {wall:8.2f} {rss:12.0f} {wall / bare_wall:8.2f}"
        print(line + (f" {wall / peer[0]:16.2f}" if peer else ""))
    print(f"cached model.pte byte-identical to the fresh compile: {same}")
    print(f"cache modes of the cached recompiles: zoo: {modes['zoo']}, factory: {modes['factory']}")
    report = json.loads((tmp / "a" / "report.json").read_text())
    stages = report.get("stages") or report.get("stage_seconds") or {}
    if stages:
        print("fresh compile stages: " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()))


if __name__ == "__main__":
    main()
