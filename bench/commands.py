"""Benchmark: commands that need no model, each in a fresh process (issue 47: <= 1 s, no torch).

Run: .venv/bin/python bench/commands.py [--model ds_cnn] [--target cortex-m33] [--repeat 3]
Compiles one zoo model (setup, not timed), then times ``etforge codegen`` of its program (the
operator-schema table warmed by one untimed run, as any compile leaves it), ``report``,
``cache info``, ``targets``, ``plugins`` and three errors that need no model. Each row: the
best wall time of ``--repeat`` runs, the ratio to ``python -c "import torch"`` measured in the
same run (a loaded machine scales both), and whether the process imported torch.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Run inside each timed process, after the command: did it import torch?
_PROBE = (
    "import sys, runpy\n"
    "sys.argv = ['etforge', *sys.argv[1:]]\n"
    "try:\n"
    "    from etforge.cli import main\n"
    "    main(standalone_mode=False)\n"
    "except BaseException:\n"
    "    pass\n"
    "sys.stderr.write('\\nTORCH=%d\\n' % ('torch' in sys.modules))\n"
)


def _time(argv: list[str], env: dict[str, str], repeat: int) -> tuple[float, bool]:
    best, torch_seen = float("inf"), False
    for _ in range(repeat):
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, env=env)
        best = min(best, time.perf_counter() - start)
        torch_seen = torch_seen or "TORCH=1" in proc.stderr
    return best, torch_seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="ds_cnn")
    parser.add_argument("--target", default="cortex-m33")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from etforge import zoo
    from etforge.core.build import output
    from etforge.core.build.report import build_report
    from etforge.core.build.session import compile_model
    from etforge.core.registry.manager import registry

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        env = {**os.environ, "ETFORGE_CACHE_DIR": str(root / "cache"), "ETFORGE_NO_CACHE": "0"}
        env["OMP_NUM_THREADS"] = env.get("OMP_NUM_THREADS", "1")
        reg = registry()
        model, example = zoo.build(args.model)
        result = compile_model(
            model, example, args.target, calibration=zoo.calibration(args.model, 2), reg=reg
        )
        out = root / "out"
        out.mkdir()
        output.write_outputs(out, result, build_report(result, reg, f"zoo:{args.model}"))
        probe = [sys.executable, "-c", _PROBE]
        subprocess.run([*probe, "codegen", str(out / "model.pte"), "-o", str(root / "warm")], env=env)
        torch_s, _ = _time([sys.executable, "-c", "import torch"], env, args.repeat)
        rows = {
            "codegen": ["codegen", str(out / "model.pte"), "-o", str(root / "gen")],
            "codegen --c-api": [
                "codegen",
                str(out / "model.pte"),
                "-o",
                str(root / "capi"),
                "--c-api",
                "net",
            ],
            "report": ["report", str(out)],
            "cache info": ["cache", "info"],
            "targets": ["targets"],
            "plugins": ["plugins"],
            "error: missing path": ["compile", str(root / "none.py") + ":build", "-o", str(root / "o")],
            "error: unknown zoo name": ["compile", "zoo:no_such_model", "-o", str(root / "o2")],
            "error: verify a non-output": ["verify", str(root)],
        }
        print(f"{args.model} {args.target}; reference `python -c 'import torch'`: {torch_s:.2f} s")
        print(f"{'command':28} {'wall s':>7} {'÷ import torch':>15}  torch imported  goal <= 1 s")
        for label, argv in rows.items():
            seconds, torch_seen = _time([*probe, *argv], env, args.repeat)
            verdict = "ok" if seconds <= 1.0 and not torch_seen else "OVER"
            print(f"{label:28} {seconds:7.2f} {seconds / torch_s:15.2f}  {str(torch_seen):14}  {verdict}")


if __name__ == "__main__":
    main()
