"""The outputs depend on the model and options alone: not on the executor (one thread, a Ray
worker, or many) and not on the process (its string hash seed, its memory addresses).

zoo:autoencoder's BatchNorm statistics and calibration ranges are float reductions whose
rounding followed the thread count (issue 25): ``OMP_NUM_THREADS=1`` gave other weights and
scales, hence other bytes, and the two executors never shared cache entries.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def _compile(out: Path, threads: str | None, model: str = "zoo:autoencoder", seed: str | None = None) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    if threads is not None:
        env["OMP_NUM_THREADS"] = threads
    if seed is not None:
        env["PYTHONHASHSEED"] = seed
    proc = subprocess.run(
        [sys.executable, "-m", "etforge", "compile", model, "-o", str(out), "--no-cache"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_one_thread_and_the_default_give_the_same_bytes(tmp_path: Path) -> None:
    _compile(tmp_path / "one", "1")
    _compile(tmp_path / "default", None)  # every core (two or more here: the test needs them)
    for name in (
        "model.pte",
        "partitions/etforge_0.tflite",
        "lowered_edge.exir",
        "float.pt2",
        "quantized.pt2",
    ):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "default" / name).read_bytes(), name


MODEL_FILE = """import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.fc = torch.nn.Linear(4 * 6 * 6, 5)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def build():
    torch.manual_seed(0)
    return Net().eval(), (torch.randn(1, 3, 8, 8),)
"""


def test_a_model_file_compiled_by_two_processes_gives_the_same_files(tmp_path: Path) -> None:
    """Every file byte for byte, the saved programs too: the model file's module name (recorded
    in each node's module stack) is no per-process string hash, and torch's node provenance
    names graphs by number, not by memory address (``core.serialize.stable_provenance``);
    ``report.json`` differs only in its stage seconds."""
    (tmp_path / "net.py").write_text(MODEL_FILE)
    for seed in ("1", "2"):
        _compile(tmp_path / seed, "1", model=f"{tmp_path / 'net.py'}:build", seed=seed)
    one, two = tmp_path / "1", tmp_path / "2"
    files = sorted(p.relative_to(one) for p in one.rglob("*") if p.is_file())
    assert {"float.pt2", "quantized.pt2", "lowered_edge.exir", "model.pte"} <= {str(f) for f in files}
    assert files == sorted(p.relative_to(two) for p in two.rglob("*") if p.is_file())
    for name in files:
        if str(name) == "report.json":
            first, second = (json.loads((d / name).read_text()) for d in (one, two))
            first.pop("stages"), second.pop("stages")
            assert first == second
        else:
            assert (one / name).read_bytes() == (two / name).read_bytes(), name
