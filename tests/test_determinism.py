"""The .pte does not depend on the executor: one thread (a Ray worker) or many, the same bytes.

zoo:autoencoder's BatchNorm statistics and calibration ranges are float reductions whose
rounding followed the thread count (issue 25): ``OMP_NUM_THREADS=1`` gave other weights and
scales, hence other bytes, and the two executors never shared cache entries.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def _compile(out: Path, threads: str | None) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if threads is not None:
        env["OMP_NUM_THREADS"] = threads
    proc = subprocess.run(
        [sys.executable, "-m", "etforge", "compile", "zoo:autoencoder", "-o", str(out), "--no-cache"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_one_thread_and_the_default_give_the_same_bytes(tmp_path: Path) -> None:
    _compile(tmp_path / "one", "1")
    _compile(tmp_path / "default", None)  # every core (two or more here: the test needs them)
    # (quantized.pt2 is not compared: torch.export.save writes a random serialization id and
    # object ids into it on every run, threads or not.)
    for name in ("model.pte", "partitions/etforge_0.tflite", "lowered_edge.exir"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "default" / name).read_bytes(), name
