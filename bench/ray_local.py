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
included (a cgroup per run: :class:`Tree`; without write access to the cgroup file system,
wall seconds only). Then per variant the ratio beside busy ÷ alone (wall and CPU). Wall
times follow the machine's load; compare ratios from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUSY = "while True:\n    pass\n"
CGROUP_V1, CGROUP_V2 = Path("/sys/fs/cgroup/cpuacct"), Path("/sys/fs/cgroup")
#: ``ray-default``: etforge's CLI with the local workers' environment as Ray leaves it.
RAY_DEFAULT = (
    "import sys, runpy\n"
    "from etforge.core.batch import run\n"
    "run.LOCAL_WORKER_ENV.clear()\n"
    "sys.argv = ['etforge', *sys.argv[1:]]\n"
    "runpy.run_module('etforge', run_name='__main__')\n"
)


class Tree:
    """CPU seconds of a process and all it starts, Ray's daemons and workers included: a
    cgroup of its own (v1 ``cpuacct`` or v2 ``cpu.stat``; needs write access to the cgroup
    file system). Ray's processes outlive the driver's wait and are not counted in its
    ``RUSAGE_CHILDREN`` (measured: about half of its start-up CPU seconds), hence a cgroup."""

    def __init__(self, name: str) -> None:
        self.path: Path | None = None
        for root, stat in ((CGROUP_V1, "cpuacct.usage"), (CGROUP_V2, "cpu.stat")):
            try:
                (root / name).mkdir()
            except OSError:
                continue
            self.path, self.stat = root / name, stat
            break

    def enter(self) -> None:
        """In the child, before exec: join the cgroup."""
        if self.path is not None:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def cpu(self, timeout: float = 60.0) -> float | None:
        """CPU seconds, once every process of the tree has exited; None without a cgroup."""
        if self.path is None:
            return None
        deadline = time.monotonic() + timeout
        while (self.path / "cgroup.procs").read_text().strip():
            if time.monotonic() > deadline:
                raise SystemExit("Ray's processes did not exit within a minute of the driver")
            time.sleep(0.2)
        text = (self.path / self.stat).read_text()
        seconds = int(text) / 1e9 if self.stat == "cpuacct.usage" else int(text.split()[1]) / 1e6
        self.path.rmdir()
        return seconds


def timed(argv: list[str], env: dict[str, str], name: str) -> tuple[float, float | None]:
    """(wall s, CPU s of the whole process tree or None) of one run."""
    tree = Tree(name)
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, preexec_fn=tree.enter)
    wall = time.perf_counter() - start
    cpu = tree.cpu()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])} failed: {proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    return wall, cpu


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
    sys.path.insert(0, str(REPO / "tests"))
    from batch_models import FACTORIES

    models = [f"{REPO / 'tests' / 'batch_models.py'}:{f}" for f in FACTORIES[: args.models]]
    env = {**os.environ}
    env.setdefault("OMP_NUM_THREADS", "1")
    results: dict[tuple[str, int], tuple[float, float | None]] = {}
    with tempfile.TemporaryDirectory(prefix="etforge-ray-bench-") as tmp:
        manifest = Path(tmp) / "m.json"
        manifest.write_text(json.dumps({"models": models, "targets": ["imxrt700"]}))
        for busy in (0, args.busy):
            hogs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(busy)]
            try:
                for variant in args.variants.split(","):
                    out = Path(tmp) / f"{variant}-{busy}"
                    wall, cpu = results[variant, busy] = timed(
                        command(variant, manifest, out), env, f"etforge-bench-{os.getpid()}-{variant}-{busy}"
                    )
                    cpu_text = (
                        "CPU n/a (no cgroup could be made here: not root?)"
                        if cpu is None
                        else f"{cpu:7.1f} s CPU"
                    )
                    print(f"{variant:12s} beside {busy} busy: {wall:7.1f} s wall {cpu_text}", flush=True)
            finally:
                for hog in hogs:
                    hog.kill()
                    hog.wait()
    print(f"\n{len(models)} jobs; beside {args.busy} busy processes ÷ alone:")
    for variant in args.variants.split(","):
        (w0, c0), (w1, c1) = results[variant, 0], results[variant, args.busy]
        cpu = "" if c0 is None or c1 is None else f"  CPU {c1 / c0:5.2f}x"
        print(f"{variant:12s} wall {w1 / w0:5.2f}x{cpu}")


if __name__ == "__main__":
    main()
