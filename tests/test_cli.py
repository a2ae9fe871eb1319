"""The describing commands: exit codes, output, and no torch import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from support import run_cli


def test_describing_commands_do_not_import_torch() -> None:
    code = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from etforge.cli import main\n"
        "for args in (['plugins'], ['targets'], ['ops', '--target', 'imxrt700cm'], ['--help']):\n"
        "    r = CliRunner().invoke(main, args)\n"
        "    assert r.exit_code == 0, (args, r.output)\n"
        "heavy = sorted(m for m in ('torch', 'executorch', 'torchao', 'numpy') if m in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_plugins_table_lists_builtins() -> None:
    proc = run_cli("plugins")
    assert proc.returncode == 0, proc.stderr
    for name in ("ops_conv", "ops_linear", "targets_neutron", "targets_cortex_m"):
        assert name in proc.stdout


def test_targets_and_ops() -> None:
    targets = json.loads(run_cli("targets", "--json").stdout)
    rt700 = next(t for t in targets if t["name"] == "imxrt700")
    assert rt700["npu"]["family"] == "neutron-c" and rt700["npu"]["limits"]["max_weight_rows"] == 65535
    ops = json.loads(run_cli("ops", "--target", "imxrt700", "--json").stdout)
    conv = next(r for r in ops if r["op"] == "aten.convolution.default")
    assert conv["plugin"] == "ops_conv" and any(
        "65535" in c or "max_weight_rows" in c for c in conv["constraints"]
    )
    table = run_cli("ops", "--target", "cortex-m33")
    assert table.returncode == 0 and "no NPU" in table.stdout


def test_unknown_target_lists_known_ones() -> None:
    proc = run_cli("ops", "--target", "imxrt1170")
    assert proc.returncode == 2  # a usage error
    assert "unknown target 'imxrt1170'" in proc.stderr
    for name in ("imxrt700", "imxrt700cm", "cortex-m33"):
        assert name in proc.stderr


def test_usage_errors_exit_2() -> None:
    assert run_cli("ops").returncode == 2  # missing --target
    assert run_cli("no-such-command").returncode == 2
    assert run_cli("--help").returncode == 0


def test_the_command_exits_with_mains_code_output_flushed_and_atexit_run(tmp_path: Path) -> None:
    """``etforge.cli.run`` skips interpreter teardown (``os._exit``), nothing else."""
    marker = tmp_path / "atexit-ran"
    code = (
        "import atexit, pathlib, sys\n"
        f"atexit.register(pathlib.Path({str(marker)!r}).write_text, 'yes')\n"
        "from etforge.cli import run\n"
        "sys.argv = ['etforge', *sys.argv[1:]]\n"
        "run()\n"
    )
    ok = subprocess.run([sys.executable, "-c", code, "targets", "--json"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert any(t["name"] == "imxrt700" for t in json.loads(ok.stdout))  # whole, flushed
    assert marker.read_text() == "yes"
    marker.unlink()
    bad = subprocess.run(
        [sys.executable, "-c", code, "report", str(tmp_path / "nothing")], capture_output=True, text=True
    )
    assert bad.returncode == 1 and "error:" in bad.stderr
    assert marker.read_text() == "yes"
    usage = subprocess.run([sys.executable, "-c", code, "compile"], capture_output=True, text=True)
    assert usage.returncode == 2


def test_python_dash_m_etforge_cli_runs_every_command(tmp_path: Path) -> None:
    """``python -m etforge.cli`` sees every command (the group is whole before it runs)."""
    env = {**os.environ, "ETFORGE_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "etforge.cli", "cache", "info"], capture_output=True, text=True, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"{tmp_path / 'v1'}: 0 builds"), proc.stdout
