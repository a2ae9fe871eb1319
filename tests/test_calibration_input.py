"""Calibration the user can see: ``--calib`` reads ``.npz`` as ``verify --data`` does, a compile
without calibration data says loudly that it calibrated on the example input alone (summary
and report.json), and ``etforge zoo`` lists the zoo without importing torch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import etforge
from etforge.core.common.errors import EtforgeError
from etforge.core.front.load import load_calibration

from support import run_cli

MODEL = """
import torch


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(16, 2))
    return model.eval(), (torch.zeros(1, 3, 4, 4),)
"""


def _samples() -> np.ndarray:
    return np.random.default_rng(0).standard_normal((5, 3, 4, 4))  # float64, one sample per row


def test_npz_calibration_is_what_the_api_calibrates_on(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(MODEL)
    np.savez(tmp_path / "cal.npz", x=_samples(), y=np.zeros(5, dtype=np.int64))  # verify --data's file
    out = tmp_path / "out"
    r = run_cli("compile", f"{tmp_path / 'm.py'}:build", "--target", "cortex-m33", "-o", str(out),
                "--calib", str(tmp_path / "cal.npz"), "--no-cache")  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "calibrated on the example input alone" not in r.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["calibration"] == {"samples": 5, "example_only": False}
    sys.path.insert(0, str(tmp_path))
    try:
        import m  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
    model, example = m.build()
    batches = [(torch.tensor(s, dtype=torch.float32).unsqueeze(0),) for s in _samples()]
    api = etforge.compile(model, example, target="cortex-m33", calibration=batches)
    assert (out / "model.pte").read_bytes() == api.pte  # the same samples, in the same order


def test_npz_calibration_errors_name_the_file(tmp_path: Path) -> None:
    example = (torch.zeros(1, 3, 4, 4),)
    bad = tmp_path / "bad.npz"
    np.savez(bad, x=np.zeros((2, 3, 5, 5)))
    with pytest.raises(EtforgeError, match=r"bad.npz: input 0 is \[2, 3, 5, 5\]; expected \[N, 3, 4, 4\]"):
        load_calibration(str(bad), example)
    ints = tmp_path / "ints.npz"
    np.savez(ints, x=np.zeros((2, 3, 4, 4), dtype=np.int64))
    with pytest.raises(
        EtforgeError, match="ints.npz: input 0 holds torch.int64; the model takes torch.float32"
    ):
        load_calibration(str(ints), example)
    two = tmp_path / "two.npz"
    np.savez(two, x0=np.zeros((2, 3, 4, 4)), x1=np.zeros((2, 3, 4, 4)))
    with pytest.raises(EtforgeError, match="two.npz: holds 2 array"):
        load_calibration(str(two), example)
    assert len(load_calibration(str(two), example * 2)) == 2  # one array per input


def test_without_calibration_data_the_summary_and_report_say_so(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(MODEL)
    out = tmp_path / "out"
    r = run_cli(
        "compile", f"{tmp_path / 'm.py'}:build", "--target", "cortex-m33", "-o", str(out), "--no-cache"
    )
    assert r.returncode == 0, r.stdout + r.stderr
    text = " ".join(r.stdout.split())
    assert "warning: calibrated on the example input alone (1 sample)" in text, r.stdout
    assert "--calib FILE" in text and ".npz" in text
    report = json.loads((out / "report.json").read_text())
    assert report["calibration"] == {"samples": 1, "example_only": True}
    r = run_cli("report", str(out))
    assert "calibrated on the example input alone" in " ".join(r.stdout.split())


def test_the_zoo_command_lists_every_model_without_torch() -> None:
    from etforge.zoo import ZOO

    code = (
        "import sys\nfrom etforge.cli import main\n"
        "try:\n    main(['zoo', '--json'])\nexcept SystemExit:\n    pass\n"
        "print('TORCH' if 'torch' in sys.modules else 'LIGHT')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    body, light = proc.stdout.rsplit("\n", 2)[0], proc.stdout.split()[-1]
    assert light == "LIGHT", "etforge zoo imported torch"
    rows = json.loads(body)
    assert [r["model"] for r in rows] == [f"zoo:{n}" for n in sorted(ZOO)]
    for r in rows:  # the catalog agrees with the models themselves
        entry = ZOO[r["model"].removeprefix("zoo:")]
        assert tuple(r["input"]) == tuple(entry.input_shape) and r["description"] == entry.description
        assert (r["weights"] == "trained") == (entry.calibrate is not None)
