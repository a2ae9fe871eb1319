"""Bad input a new user tries: one ``error:`` line naming the culprit, never a traceback.

Message checks run the CLI in process (torch is imported once); what is about the process
(torch's own logging before our message, ``--debug``, the last-resort handler, file
systems) runs ``etforge`` as a subprocess.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from support import REPO, run_cli, write_distribution

MODEL = str(REPO / "tests" / "models" / "user_models.py")


def cli(*args: str) -> tuple[int, str, str]:
    """The CLI in this process, 200 columns wide whatever an earlier test left the console at
    (a narrower summary shows fewer notes and counts the rest)."""
    from etforge.cli import common, main

    widths = common.console.width, common.err_console.width
    common.console.width = common.err_console.width = 200
    try:
        r = CliRunner().invoke(main, ["-v", *args])  # -v: keep this process's logging as it is
    finally:
        common.console.width, common.err_console.width = widths
    return r.exit_code, r.stdout, r.stderr


def one_error(args: tuple[str, ...], code: int = 1) -> str:
    """Runs the CLI; asserts exit ``code`` and exactly one ``error:`` line; returns it."""
    rc, out, err = cli(*args)
    assert rc == code, out + err
    errors = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, err
    assert "Traceback" not in err and "\x1b" not in err and "Error:" not in err, err
    return errors[0]


def test_all_nan_calibration_names_the_file(tmp_path: Path) -> None:
    calib = tmp_path / "calib.pt"
    torch.save([(torch.full((1, 3, 8, 8), float("nan")),)], calib)
    line = one_error(("compile", f"{MODEL}:small", "--calib", str(calib), "-o", str(tmp_path / "o")))
    assert "calib.pt: calibration batch 0, input 0 holds 192 NaN or infinite value(s)" in line
    assert not (tmp_path / "o").exists()


def test_pt2_with_a_nan_weight_names_the_weight(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2).eval()
    with torch.no_grad():
        model.weight[0, 1] = float("nan")
    pt2 = tmp_path / "nan.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(1, 4),)), str(pt2))
    line = one_error(("compile", str(pt2), "-o", str(tmp_path / "o")))
    assert "nan.pt2: weight 'weight' holds 1 NaN or infinite value(s) of 8" in line


def test_dynamic_batch_is_fixed_with_a_note(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2).eval()
    batch = torch.export.Dim("batch")
    pt2 = tmp_path / "dyn.pt2"
    ep = torch.export.export(model, (torch.randn(3, 4),), dynamic_shapes=({0: batch},))
    torch.export.save(ep, str(pt2))
    out = tmp_path / "o"
    rc, stdout, stderr = cli("compile", str(pt2), "--target", "imxrt700", "-o", str(out))
    assert rc == 0, stdout + stderr
    note = "input 'input' has dynamic dimension(s) [0]; compiled for the example shape [3, 4]"
    assert any(note in n for n in json.loads((out / "report.json").read_text())["notes"])
    assert "note: input 'input' has dynamic dimension(s) [0]" in stdout


def test_negative_memory_budget_is_bad_usage(tmp_path: Path) -> None:
    line = one_error(("compile", "zoo:cifarnet", "-o", str(tmp_path / "o"), "--memory-budget", "-5"), code=2)
    assert "--memory-budget" in line and "-5" in line


def test_pickled_objects_in_calibration_without_colour_codes(tmp_path: Path) -> None:
    calib = tmp_path / "calib.pt"
    torch.save([{"x": torch.randn(1, 3, 8, 8), "when": __import__("datetime").date(2024, 1, 1)}], calib)
    line = one_error(("compile", f"{MODEL}:small", "--calib", str(calib), "-o", str(tmp_path / "o")))
    assert "calib.pt: holds objects other than tensors" in line and "datetime" in line


def _fake_output(tmp_path: Path, report: str | None) -> Path:
    out = tmp_path / "out"
    out.mkdir()
    (out / "model.pte").write_bytes(b"\x00" * 64)
    if report is not None:
        (out / "report.json").write_text(report)
    return out


@pytest.mark.parametrize(
    ("content", "expect"),
    [
        ('{"model": "x", "nodes": [', "report.json: not valid JSON (line 1, column 26"),
        ('{"model": "x"}', "report.json: not an etforge report (no 'target'"),
        ("[1, 2]", "report.json: not an etforge report (a JSON list)"),
    ],
    ids=["corrupt", "foreign", "list"],
)
def test_bad_report_json_in_report_verify_codegen(tmp_path: Path, content: str, expect: str) -> None:
    out = _fake_output(tmp_path, content)
    for args in (
        ("report", str(out)),
        ("report", str(out), "--ops"),
        ("verify", str(out)),
        ("codegen", str(out / "model.pte"), "-o", str(tmp_path / "gen")),
        ("codegen", str(out / "model.pte"), "--report", str(out / "report.json"), "-o", str(tmp_path / "g")),
    ):
        assert expect in one_error(args), args


def test_truncated_quantized_program_in_verify(tmp_path: Path) -> None:
    from etforge.core.build import output

    report = {k: None for k in output.REPORT_KEYS} | {"quantized": True, "nodes": [], "partitions": []}
    out = _fake_output(tmp_path, json.dumps(report))
    model = torch.nn.Linear(4, 2).eval()
    torch.export.save(torch.export.export(model, (torch.randn(1, 4),)), str(out / "float.pt2"))
    data = (out / "float.pt2").read_bytes()
    (out / "quantized.pt2").write_bytes(data[: len(data) // 2])
    line = one_error(("verify", str(out)))
    assert "quantized.pt2: truncated or not a torch.export program" in line


def test_unknown_option_and_prefix_style(tmp_path: Path) -> None:
    line = one_error(("compile", f"{MODEL}:small", "-o", str(tmp_path / "o"), "--option", "turbo=1"), code=2)
    assert line.startswith("error: Invalid value for --option: unknown option 'turbo'")  # a usage error
    usage = one_error(("compile", "--no-such-flag"), code=2)  # click's own errors, same prefix
    assert usage.startswith("error: ") and "--no-such-flag" in usage


def test_output_under_proc_fails_before_compiling(tmp_path: Path) -> None:
    proc = run_cli("compile", "zoo:cifarnet", "-o", "/proc/etforge-out")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: cannot write the output /proc/etforge-out: /proc")
    assert "load" not in proc.stdout  # refused before loading the model


def test_output_in_an_immutable_directory(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    if subprocess.run(["chattr", "+i", str(locked)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i needs CAP_LINUX_IMMUTABLE")
    try:
        proc = run_cli("compile", "zoo:cifarnet", "-o", str(locked / "out"))
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert f"cannot write the output {locked / 'out'}" in proc.stderr
        assert "Operation not permitted" in proc.stderr and "load" not in proc.stdout
        # an existing output that is itself immutable is refused before compiling, too
        subprocess.run(["chattr", "-i", str(locked)], check=True)
        (locked / "out").mkdir()
        subprocess.run(["chattr", "+i", str(locked / "out")], check=True)
        proc = run_cli("compile", "zoo:cifarnet", "-o", str(locked / "out"))
        assert proc.returncode == 1 and "is not writable" in proc.stderr, proc.stderr
    finally:
        subprocess.run(["chattr", "-i", str(locked), str(locked / "out")], capture_output=True)


def test_output_on_a_read_only_mount(tmp_path: Path) -> None:
    unshare = shutil.which("unshare")
    ro = tmp_path / "ro"
    ro.mkdir()
    probe = subprocess.run(
        [unshare or "unshare", "-rm", "sh", "-c", f"mount --bind -o ro {ro} {ro} && true"],
        capture_output=True,
    )
    if unshare is None or probe.returncode != 0:
        pytest.skip("no user namespaces to make a read-only bind mount")
    script = f'mount --bind -o ro {ro} {ro} && exec "$0" -m etforge compile zoo:cifarnet -o {ro}/out'
    proc = subprocess.run(
        [unshare, "-rm", "sh", "-c", script, sys.executable], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"cannot write the output {ro}/out" in proc.stderr and "Read-only file system" in proc.stderr


WRONG_SHAPE = """
import torch


def build():
    return torch.nn.Linear(16, 4), (torch.randn(1, 8),)
"""


def test_wrong_input_shape_prints_only_our_line(tmp_path: Path) -> None:
    model = tmp_path / "wrong.py"
    model.write_text(WRONG_SHAPE)
    proc = run_cli("compile", f"{model}:build", "--target", "imxrt700", "-o", str(tmp_path / "o"))
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: torch.export rejected"), proc.stderr
    assert "Traceback" not in proc.stderr and "fake_tensor" not in proc.stderr


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    plain = run_cli("report", str(tmp_path))
    assert plain.returncode == 1 and "Traceback" not in plain.stderr
    assert plain.stderr.strip().splitlines() == [
        f"error: {tmp_path}: no report.json here; run etforge compile first"
    ]
    debug = run_cli("--debug", "report", str(tmp_path))
    assert debug.returncode == 1 and "Traceback" in debug.stderr and "EtforgeError" in debug.stderr
    env = {**os.environ, "ETFORGE_DEBUG": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "etforge", "report", str(tmp_path)], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 1 and "Traceback" in proc.stderr


BROKEN = """
from etforge import hookimpl
from etforge.core.contracts.npu_compiler import NpuCompiler
from etforge.core.contracts.target import NpuSpec, TargetSpec


class Broken(NpuCompiler):
    name = "broken-compiler"

    def available(self):
        raise KeyError("license server")

    def compile(self, tflite, target, options, partition):
        raise NotImplementedError


@hookimpl
def etforge_npu_compilers():
    return [Broken()]


@hookimpl
def etforge_targets():
    return [TargetSpec(name="broken-npu", description="x", npu=NpuSpec(family="litert", compiler="broken-compiler"))]
"""


def test_unexpected_exception_is_one_line_with_a_hint(tmp_path: Path) -> None:
    site = write_distribution(
        tmp_path / "site", "broken-npu", "0.1", {"broken": "broken_npu"}, {"broken_npu": BROKEN}
    )
    proc = run_cli("targets", pythonpath=site)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: unexpected KeyError: 'license server'"), (
        proc.stderr
    )
    assert "run with --debug for the traceback" in lines[0]
    debug = run_cli("--debug", "targets", pythonpath=site)
    assert "Traceback" in debug.stderr and "broken_npu.py" in debug.stderr
