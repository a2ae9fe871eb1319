"""Benchmark: ``etforge compile --manifest M --ray local`` alone and beside busy processes.

Run: .venv/bin/python bench/ray_local.py [--models 4] [--busy 2] [--variants ours,ray-default,pool]

One manifest of tests/batch_models.py's factories (the first ``--models`` of its twelve) on
``imxrt700`` with ``--no-cache``, compiled by each variant as its own process:

- ``ours``: ``--ray local`` as etforge starts it (workers at the caller's priority);
- ``ray-default``: the same with Ray's own worker niceness (etforge's ``LOCAL_WORKER_ENV``
  emptied in that process: what ``--ray local`` did before);
- ``pool``: the local pool, ``--jobs 2``, for reference.

Each variant runs alone, then beside ``--busy`` processes that never sleep (started first,
stopped after: the shape of a loaded build machine or of pytest's other workers). Printed per
run: wall seconds and CPU seconds of the whole process tree, Ray's daemons and workers
included: this process makes itself the reaper of orphans (``PR_SET_CHILD_SUBREAPER``), so
the Ray processes the driver leaves behind are waited for here and counted in
``RUSAGE_CHILDREN``. Then per variant the ratio beside busy ÷ alone (wall and CPU). Wall
times follow the machine's load; compare ratios from one run.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUSY = "while True:\n    pass\n"
PR_SET_CHILD_SUBREAPER = 36
#: ``ray-default``: etforge's CLI with the local workers' environment as Ray leaves it.
RAY_DEFAULT = (
    "import sys, runpy\n"
    "from etforge.core.batch import run\n"
    "run.LOCAL_WORKER_ENV.clear()\n"
    "sys.argv = ['etforge', *sys.argv[1:]]\n"
    "runpy.run_module('etforge', run_name='__main__')\n"
)


def children() -> set[int]:
    """This process's children, orphans it adopted included (from /proc)."""
    me, kids = os.getpid(), set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == me:
            kids.add(int(stat.parent.name))
    return kids


def reap_orphans(keep: set[int], timeout: float = 60.0) -> None:
    """Wait for every descendant left behind (Ray's daemons exit after the driver), all but
    the ``keep`` children (the busy processes)."""
    deadline = time.monotonic() + timeout
    while children() - keep:
        if time.monotonic() > deadline:
            raise SystemExit("Ray's processes did not exit within a minute of the driver")
        for pid in children() - keep:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        time.sleep(0.2)


def timed(argv: list[str], env: dict[str, str], keep: set[int]) -> tuple[float, float]:
    """(wall s, CPU s of the whole process tree) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    reap_orphans(keep)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])} failed: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def command(variant: str, manifest: Path, out: Path) -> list[str]:
    args = ["compile", "--manifest", str(manifest), "-o", str(out), "--no-cache"]
    if variant == "pool":
        return [sys.executable, "-m", "etforge", *args, "--jobs", "2"]
    args += ["--ray", "local"]
    if variant == "ray-default":
        return [sys.executable, "-c", RAY_DEFAULT, *args]
    return [sys.executable, "-m", "etforge", *args]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=4, help="how many of the twelve factories")
    parser.add_argument("--busy", type=int, default=2, help="busy processes beside the loaded runs")
    parser.add_argument("--variants", default="ours,ray-default,pool")
    args = parser.parse_args()
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("cannot become the reaper of orphans (Linux only): Ray's CPU would be lost")
    sys.path.insert(0, str(REPO / "tests"))
    from batch_models import FACTORIES

    models = [f"{REPO / 'tests' / 'batch_models.py'}:{f}" for f in FACTORIES[: args.models]]
    env = {**os.environ}
    env.setdefault("OMP_NUM_THREADS", "1")
    results: dict[tuple[str, int], tuple[float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="etforge-ray-bench-") as tmp:
        manifest = Path(tmp) / "m.json"
        manifest.write_text(json.dumps({"models": models, "targets": ["imxrt700"]}))
        for busy in (0, args.busy):
            hogs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(busy)]
            try:
                for variant in args.variants.split(","):
                    out = Path(tmp) / f"{variant}-{busy}"
                    wall, cpu = results[variant, busy] = timed(
                        command(variant, manifest, out), env, {h.pid for h in hogs}
                    )
                    print(
                        f"{variant:12s} beside {busy} busy: {wall:7.1f} s wall {cpu:7.1f} s CPU", flush=True
                    )
            finally:
                for hog in hogs:
                    hog.kill()
                    hog.wait()
    print(f"\n{len(models)} jobs; beside {args.busy} busy processes ÷ alone:")
    for variant in args.variants.split(","):
        (w0, c0), (w1, c1) = results[variant, 0], results[variant, args.busy]
        print(f"{variant:12s} wall {w1 / w0:5.2f}x  CPU {c1 / c0:5.2f}x")


if __name__ == "__main__":
    main()
