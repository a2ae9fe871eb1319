"""The local batch's fork server: one interpreter that makes a compile's imports once, then
forks one child per job (``core.batch.run.run_local``).

Started as ``python -m etforge --batch-fork-server SPEC`` -- the argv, environment, working
directory and ``sys.path`` a job's own ``python -m etforge compile`` child would have -- it
imports what every compile imports, in ``cli/compile.py``'s order, and nothing of any model.
It runs no torch op before forking (a fork after OpenMP's threads exist can hang). Each child
then runs the CLI as that fresh child would, its stdout and stderr in files of its own and its
random generators reseeded from the OS as a fresh process's are; the server only forks and
reaps, writing one ``RESULT`` line per finished job on its stdout.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from etforge.core.batch.run import RESULT


def preload() -> None:
    """What every compile imports before it reads a model: the CLI (as any command), then
    ``cli/compile.py``'s two import stages."""
    from etforge.cli.compile import front_imports, stack_imports

    front_imports()
    stack_imports()


def _reseed() -> None:
    """A fresh process's random state: torch's default generator seeded anew (a fresh process's
    ``torch.initial_seed()`` differs every time; docs/batch.md), Python's and NumPy's too."""
    import random

    import torch

    torch.seed()
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def _child(argv: list[str], out: str, err: str) -> None:
    """The forked job: stdout/stderr to its files, then ``etforge ARGV``; never returns."""
    try:
        for fd, path in ((1, out), (2, err)):
            new = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(new, fd)
            os.close(new)
        _reseed()
        from etforge.cli import run

        sys.argv = [sys.argv[0], *argv]
        run()  # exits the child
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:  # never back into the server's loop: a child that did not exit is a failure
        sys.stderr.flush()
        os._exit(70)


def serve(spec_path: str) -> None:
    """Run the jobs of ``spec_path`` (JSON: ``workers``, ``jobs`` = [argv, out, err] each), at
    most ``workers`` at a time; one result line per job as it ends; never returns."""
    spec = json.loads(Path(spec_path).read_text())
    workers, jobs = max(1, int(spec["workers"])), spec["jobs"]
    preload()
    running: dict[int, tuple[int, float]] = {}

    def reap() -> None:
        pid, status = os.wait()
        i, start = running.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        seconds = time.perf_counter() - start
        sys.stdout.write(RESULT + json.dumps({"i": i, "code": code, "seconds": seconds}) + "\n")
        sys.stdout.flush()

    for i, (argv, out, err) in enumerate(jobs):
        while len(running) >= workers:
            reap()
        sys.stdout.flush()
        sys.stderr.flush()
        start = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            _child(argv, out, err)
        running[pid] = (i, start)
    while running:
        reap()
    sys.stdout.flush()
    os._exit(0)
