"""A quiet, readable CLI: no third-party noise, a one-screen compile summary, unbroken piped names."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support import run_cli

#: What torch, torchao and ExecuTorch print on this stack when left alone.
NOISE = re.compile(
    r"Failed to load|Warning|warning|deprecated|No complete tensor|^[WEI]\d{4} |Traceback|pytree|INFO: Created",
    re.MULTILINE,
)
SCREEN = (80, 24)  # columns, lines: one classic terminal


def _run(*args: str, columns: int = 80, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run(
        [sys.executable, "-m", "etforge", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        cwd=cwd,
    )


def test_compile_fits_one_screen_without_noise(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _run("compile", "zoo:cifarnet", "--target", "imxrt700", "-o", "out", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    text = proc.stdout + proc.stderr
    lines = text.splitlines()
    assert len(lines) <= SCREEN[1], text
    assert max(len(ln) for ln in lines) <= SCREEN[0], text
    assert not NOISE.search(text), text
    report = json.loads((out / "report.json").read_text())
    share = f"{100 * report['macs']['npu_share']:.1f}% of {report['macs']['total']:,} MACs on the NPU"
    assert share in proc.stdout and "host-only" in proc.stdout
    assert "per node: etforge report out --ops" in proc.stdout
    for node in report["nodes"]:  # the per-node table is report --ops, not compile
        assert node["node"] not in proc.stdout
    table = run_cli("report", str(out), "--ops")
    assert table.returncode == 0 and all(n["node"] in table.stdout for n in report["nodes"])
    checked = _run("verify", "out", "--samples", "2", "--min-top1", "0", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "verify passed" in checked.stdout
    assert not NOISE.search(checked.stdout + checked.stderr), checked.stdout + checked.stderr


def test_summary_is_bounded_for_any_report() -> None:
    """A report with many CPU op groups, long notes and long names still fits 80x24, and no
    line is cut: reasons and the host-only status are wrapped whole, notes that do not fit
    are counted (report.json has them)."""
    from etforge.core.build.summary import cpu_groups, summary_lines

    nodes = [
        {
            "node": f"n{i}",
            "op": f"aten.some_very_long_operator_name_number_{i % 9}.default",
            "placement": "portable",
            "cpu_op": None,
            "reason": "refused because " + "the limit is exceeded " * (i % 5 + 1),
        }
        for i in range(400)
    ] + [{"node": f"npu{i}", "op": "aten.convolution.default", "placement": "npu"} for i in range(50)]
    report = {
        "model": "zoo:" + "m" * 60,
        "target": "imxrt700",
        "cpu_backend": "portable",
        "nodes": nodes,
        "macs": {"total": 10**9, "npu": 10**8, "npu_share": 0.1},
        "partitions": [{"litert_ops": 3, "boundary_transposes": 1}] * 40,
        "cpu_layout_conversions": [{}] * 7,
        "memory": {
            "arena_bytes": [123456, 7890],
            "lower_bound_bytes": 100000,
            "flash_bytes": 10**7,
            "pte_bytes": 10**7,
        },
        "notes": ["a note that goes on and on " * 20] * 5,
        "npu_figures": {
            "num_macs": {"value": 16, "assumption": True, "source": "assumption: " + "why " * 40}
        },
        "host_only": True,
        "npu_compiler": {"status": "eIQ Neutron SDK not installed: " + "explanation " * 8 + "fix"},
    }
    lines = summary_lines(report, "/some/output/dir", width=SCREEN[0])
    # room for compile's stage lines above it: load, export, rewrite, quantize, lower,
    # serialize, write, codegen
    assert len(lines) <= SCREEN[1] - 8, lines
    assert max(len(ln) for ln in lines) <= SCREEN[0], lines
    text = " ".join(" ".join(lines).split())
    assert "…" not in text and "explanation " * 8 + "fix" in text, lines
    for _, _, _, why in cpu_groups(report)[:2]:  # the reasons shown are whole
        assert " ".join(why.split()) in text, (why, lines)
    assert "more (etforge report /some/output/dir --json)" in text, lines  # the notes not shown


def test_piped_tables_keep_whole_names() -> None:
    proc = subprocess.run(
        f"{sys.executable} -m etforge ops --target imxrt700 | grep max_pool2d",
        shell=True,
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert proc.returncode == 0 and "aten.max_pool2d" in proc.stdout, proc.stdout + proc.stderr
    table = _run("ops", "--target", "imxrt700").stdout
    words = " ".join(table.split())  # wide tables wrap between words only (records)
    for row in json.loads(run_cli("ops", "--target", "imxrt700", "--json").stdout):
        assert row["op"] in table and row["plugin"] in table
        assert all(" ".join(c.split()) in words for c in row["constraints"]), row
    assert "…" not in table


@pytest.mark.parametrize("verbose", [False, True], ids=["quiet", "verbose"])
def test_quiet_silences_torchao_at_import(verbose: bool) -> None:
    code = (
        "import sys\n"
        "from etforge.core.common import quiet\n"
        f"quiet.install(verbose={verbose})\n"
        "import torchao, warnings, logging\n"
        "warnings.warn('library chatter', FutureWarning)\n"
        "logging.getLogger('torch.fx').warning('W-level torch log')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    if verbose:
        assert "library chatter" in proc.stderr and "W-level torch log" in proc.stderr
    else:
        assert proc.stderr == ""


def test_quiet_drops_library_logs_and_keeps_a_plugins() -> None:
    """Quiet drops what the libraries log (by logger name, or logged from their files on the
    root logger, as ExecuTorch does) and nothing else: a plugin's logger still speaks."""
    code = (
        "import logging, os\n"
        "import executorch\n"
        "from etforge.core.common import quiet\n"
        "quiet.install()\n"
        "logging.getLogger('myplugin').warning('plugin warning stays')\n"
        "logging.getLogger('torchao.quantization').warning('torchao chatter')\n"
        "inside = os.path.join(list(executorch.__path__)[0], 'exir', 'some_pass.py')\n"
        "exec(compile('import logging; logging.warning(\"root chatter\")', inside, 'exec'))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "plugin warning stays\n", proc.stderr


def test_compile_shows_a_plugin_loggers_warning(tmp_path: Path) -> None:
    """A logger that is not a library's (a plugin's, or the model file's own, as here) reaches
    stderr of a quiet ``etforge compile``; the libraries' noise does not."""
    model = tmp_path / "m.py"
    model.write_text(
        "import logging\n"
        "import torch\n"
        "def build():\n"
        "    logging.getLogger('myplugin').warning('myplugin: calibration looks thin')\n"
        "    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()), (torch.randn(1, 8),)\n"
    )
    out = tmp_path / "out"
    for extra in ((), ("--quiet",)):
        proc = run_cli(
            "compile", f"{model}:build", "--target", "litert", "-o", str(out), "--no-cache", *extra
        )
        assert proc.returncode == 0, proc.stderr
        assert "myplugin: calibration looks thin" in proc.stderr, proc.stderr
        rest = proc.stderr.replace("myplugin: calibration looks thin", "")
        assert not NOISE.search(rest), proc.stderr
