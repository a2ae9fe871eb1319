"""Benchmark: what ``etforge verify`` costs against the compile it checks, alone and beside a busy process.

Run: .venv/bin/python bench/verify_cost.py [--models mobilenet_v2_96] [--targets imxrt700cm,cortex-m33]
                                           [--samples 32] [--busy]
(or ``bench/verify.py --cost ...``).

Per model and target, in this one run: ``etforge compile zoo:M --target T --no-cache -o OUT``
and ``etforge verify OUT --samples N --json`` as their own processes, with the environment as
the user has it (no ``OMP_NUM_THREADS``: the thread counts are etforge's own choice). Printed:
each one's wall and CPU seconds (user + system of the process and its children) and
verify ÷ compile for both (the goal: <= 1.0), and verify's seconds per step
(``Verification.seconds``: where its time goes). ``--busy``: verify again beside one busy
process (a Python loop that never sleeps, started first and stopped after) and the ratio of
its CPU seconds beside it to alone (the goal: <= 1.2: no thread of verify's spins for a core
the other process holds). Wall times follow the machine's load; the ratios come from one run.
Each ratio is printed against its goal (issue 47: verify ÷ compile <= 1.0, busy ÷ alone <= 1.2).
``--threads``: verify run once more with each thread's CPU seconds counted as it ends (the
main thread's at the exit; ``THREADS`` below), printed by thread name: which of them a cut
would shorten (the main thread is the wall time's path, the others run beside it).
``--seconds-goal FILE.py:factory``: that model (timm's mobilevit_xxs in issue 47; timm is not
a dependency, so it comes as a factory) compiled for cortex-m33 and verified on 32 samples, its
verify seconds (wall, CPU) against the goal of 60.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUSY = "while True:\n    pass\n"
#: ``python -m etforge`` with each thread's CPU seconds (user + system, ``RUSAGE_THREAD``) written
#: to the file in ``ETFORGE_BENCH_THREADS`` as JSON: the threads as each ends, the main thread
#: at ``os._exit`` (``cli.run`` leaves by it); nothing else of the command changes.
THREADS = r"""
import json, os, resource, sys, threading

spent = []

def cpu():
    r = resource.getrusage(resource.RUSAGE_THREAD)
    return r.ru_utime + r.ru_stime

def counted(run):
    def wrapper(self):
        try:
            run(self)
        finally:
            spent.append([self.name, cpu()])
    return wrapper

threading.Thread.run = counted(threading.Thread.run)
leave = os._exit

def exit_counted(code):
    with open(os.environ["ETFORGE_BENCH_THREADS"], "w") as f:
        json.dump([["main", cpu()], *spent], f)
    leave(code)

os._exit = exit_counted
sys.argv = ["etforge", *sys.argv[1:]]
from etforge.cli import run

run()
"""
#: The goals (issue 47): verify's CPU (and wall) seconds over the compile's; busy over alone;
#: a real model's verify seconds on cortex-m33.
RATIO_GOAL, BUSY_GOAL, SECONDS_GOAL = 1.0, 1.2, 60.0


def against(value: float, goal: float) -> str:
    return f"{'met' if value <= goal else 'NOT met'} (<= {goal:g})"


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """(wall s, CPU s, stdout) of one child process; CPU = its user + system, children included."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[2:6])} failed: {proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, proc.stdout


def etforge(*args: str) -> list[str]:
    return [sys.executable, "-m", "etforge", *args]


def by_thread(args: list[str], env: dict[str, str], record: Path) -> str:
    """One more run of ``etforge ARGS`` with its CPU seconds per thread (``THREADS``)."""
    _, cpu, _ = timed([sys.executable, "-c", THREADS, *args], {**env, "ETFORGE_BENCH_THREADS": str(record)})
    threads = json.loads(record.read_text())
    counted = sum(s for _, s in threads)
    return f"verify's CPU s by thread (another run: {cpu:.1f} CPU s, {counted:.1f} counted): " + ", ".join(
        f"{name} {s:.2f}" for name, s in threads
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="mobilenet_v2_96")
    parser.add_argument("--targets", default="imxrt700cm,cortex-m33")
    parser.add_argument("--samples", type=int, default=32)
    parser.add_argument("--busy", action="store_true", help="verify again beside one busy process")
    parser.add_argument("--threads", action="store_true", help="verify's CPU seconds per thread")
    parser.add_argument(
        "--seconds-goal", metavar="FILE.py:factory", help="a model whose verify must take <= 60 s"
    )
    args = parser.parse_args()
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    print(
        f"{'model':>16} {'target':>11} {'compile s':>9} {'cpu':>6} {'verify s':>8} {'cpu':>6} "
        f"{'verify/compile wall':>19} {'cpu':>5}"
        + (f" {'busy: verify cpu':>16} {'ratio':>5}" if args.busy else "")
    )
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            for target in args.targets.split(","):
                out = str(Path(tmp) / f"{model}-{target}")
                c_wall, c_cpu, _ = timed(
                    etforge("compile", f"zoo:{model}", "--target", target, "--no-cache", "-o", out), env
                )
                check = etforge("verify", out, "--samples", str(args.samples), "--json")
                v_wall, v_cpu, text = timed(check, env)
                line = (
                    f"{model:>16} {target:>11} {c_wall:>9.1f} {c_cpu:>6.1f} {v_wall:>8.1f} {v_cpu:>6.1f} "
                    f"{v_wall / c_wall:>18.2f}x {v_cpu / c_cpu:>4.2f}x"
                )
                if args.busy:
                    busy = subprocess.Popen([sys.executable, "-c", BUSY])
                    try:
                        _, b_cpu, _ = timed(check, env)
                    finally:
                        busy.kill()
                        busy.wait()
                    line += f" {b_cpu:>16.1f} {b_cpu / v_cpu:>4.2f}x"
                print(line, flush=True)
                print(
                    f"    goal verify/compile: cpu {against(v_cpu / c_cpu, RATIO_GOAL)}, wall "
                    f"{against(v_wall / c_wall, RATIO_GOAL)}"
                    + (f"; busy/alone {against(b_cpu / v_cpu, BUSY_GOAL)}" if args.busy else ""),
                    flush=True,
                )
                seconds = json.loads(text)["seconds"]
                print(
                    "    verify's steps (s): " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items()),
                    flush=True,
                )
                if args.threads:
                    print("    " + by_thread(check[3:], env, Path(tmp) / "threads.json"), flush=True)
        if args.seconds_goal:
            out = str(Path(tmp) / "seconds-goal")
            c_wall, c_cpu, _ = timed(
                etforge("compile", args.seconds_goal, "--target", "cortex-m33", "--no-cache", "-o", out), env
            )
            v_wall, v_cpu, text = timed(etforge("verify", out, "--samples", "32", "--json"), env)
            print(
                f"{args.seconds_goal} cortex-m33: compile {c_wall:.1f} s ({c_cpu:.1f} CPU s), verify 32 samples "
                f"{v_wall:.1f} s ({v_cpu:.1f} CPU s): wall {against(v_wall, SECONDS_GOAL)}, CPU "
                f"{against(v_cpu, SECONDS_GOAL)}",
                flush=True,
            )
            seconds = json.loads(text)["seconds"]
            print(
                "    verify's steps (s): " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items()), flush=True
            )


if __name__ == "__main__":
    main()
