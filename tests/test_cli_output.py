"""Output that fits: piped tables at 100 columns, --quiet, compile --json, exit 2 for usage
errors, a broken pipe that does not kill a compile, a quiet Python API, README = CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.table import Table

from support import REPO, cli_in_process

#: Piped output's width when $COLUMNS does not say (cli.PIPED_WIDTH).
WIDTH = 100
NOISE = re.compile(r"Failed to load|Warning|deprecated|^[WEI]\d{4} |Traceback|pytree", re.MULTILINE)

FACTORY = """
import torch


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32, 5),
    ).eval()
    g = torch.Generator().manual_seed(1)
    calib = [(torch.randn(1, 3, 4, 4, generator=g),) for _ in range(4)]
    return model, calib[0], calib
"""


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # piped, as in a script
    env["ETFORGE_CACHE_DIR"] = str(tmp / "cache")
    return env


def _etforge(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "etforge", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=900,
    )


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("cli_output")
    (tmp / "net.py").write_text(FACTORY)
    return tmp


@pytest.fixture(scope="module")
def piped_out(work: Path) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """``etforge compile ... | head -1``: the reader goes away after the first line."""
    cmd = (
        f"{sys.executable} -m etforge compile net.py:build -t imxrt700 -o out --no-cache | head -1; "
        'echo "status=${PIPESTATUS[0]}" >&2'
    )
    proc = subprocess.run(
        ["bash", "-c", cmd], capture_output=True, text=True, cwd=work, env=_env(work), timeout=900
    )
    return work / "out", proc


def test_a_broken_pipe_leaves_the_output_written(
    piped_out: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    import hashlib

    out, proc = piped_out
    assert len(proc.stdout.splitlines()) == 1
    lines = proc.stderr.splitlines()
    assert lines[-1] == "status=141", proc.stderr  # 128 + SIGPIPE, as a shell reports it
    assert len(lines) == 2 and lines[0].startswith("warning: stdout was closed early (broken pipe)"), lines
    report = json.loads((out / "report.json").read_text())
    assert hashlib.sha256((out / "model.pte").read_bytes()).hexdigest() == report["pte_sha256"]
    assert (out / "partitions" / "etforge_0.tflite").is_file() and (out / "codegen").is_dir()


def test_compile_json_and_quiet(work: Path) -> None:
    env = _env(work)
    proc = _etforge("compile", "net.py:build", "-t", "imxrt700", "-o", "jout", "--json", cwd=work, env=env)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)  # nothing else on stdout
    report = json.loads((work / "jout" / "report.json").read_text())
    assert summary["macs"] == report["macs"] and summary["out"] == "jout" and summary["cached"] is False
    assert [p["name"] for p in summary["partitions"]] == [p["name"] for p in report["partitions"]]
    assert summary["host_only"] is True and summary["memory"]["pte_bytes"] == report["memory"]["pte_bytes"]
    quiet = _etforge("compile", "net.py:build", "-t", "imxrt700", "-o", "jout", "-q", cwd=work, env=env)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    (line,) = quiet.stdout.splitlines()
    assert line.startswith("compiled net.py:build for imxrt700: jout (") and "100.0% of" in line
    checked = _etforge("verify", "jout", "-q", "--samples", "2", "--min-top1", "0", cwd=work, env=env)
    assert checked.returncode == 0 and checked.stdout == "verify passed\n", checked.stdout + checked.stderr


def test_piped_tables_fit_and_keep_names_whole(
    work: Path, piped_out: tuple[Path, subprocess.CompletedProcess[str]]
) -> None:
    env = _env(work)
    table = _etforge("ops", "--target", "imxrt700", cwd=work, env=env)
    assert table.returncode == 0
    lines = table.stdout.splitlines()
    assert max(len(ln) for ln in lines) <= WIDTH
    rows = json.loads(_etforge("ops", "--target", "imxrt700", "--json", cwd=work, env=env).stdout)
    words = set(table.stdout.split())
    for row in rows:
        assert row["op"] in words and row["plugin"] in words  # whole, never folded
    nodes = _etforge("report", "out", "--ops", cwd=work, env=env)
    assert max(len(ln) for ln in nodes.stdout.splitlines()) <= WIDTH
    report = json.loads((piped_out[0] / "report.json").read_text())
    assert all(n["node"] in nodes.stdout.splitlines() for n in report["nodes"])  # each on its own line


def test_records_wrap_between_words_only() -> None:
    from etforge.cli.common import table_records

    table = Table(title="t")
    for col in ("name", "placement", "reason"):
        table.add_column(col)
    long_name = "aten." + "x" * 150 + ".default"
    table.add_row(long_name, "cpu", "because " * 40)
    lines = table_records(table, 60).splitlines()
    assert lines[0] == "t" and lines[1] == long_name and lines[2] == "    placement: cpu"
    assert all(len(ln) <= 60 for ln in lines[2:]) and len(lines) > 5
    assert " ".join(ln.strip() for ln in lines[3:]).removeprefix("reason: ").split() == ["because"] * 40
    pairs = Table(title="verify")  # a key/value table: "key: value" per row
    pairs.add_column("metric")
    pairs.add_column("value")
    pairs.add_row("max |ours - float|", "0.126")
    assert table_records(pairs, 60).splitlines() == ["verify", "max |ours - float|: 0.126"]


#: The usage error run as ``python -m etforge`` (the others run in this process).
USAGE_END_TO_END = ("compile", "x.py:build", "--target", "imxrt700", "--option", "turbo=1", "-o", "o")


@pytest.mark.parametrize(
    "args",
    [
        ("ops", "--target", "imx93"),
        ("compile", "x.py:build", "--target", "imx93", "-o", "o"),
        ("compile", "x.py:build", "--target", "imxrt700", "--option", "turbo=1", "-o", "o"),
        ("compile", "x.py:build", "--target", "imxrt700", "--option", "min_partition_ops=many", "-o", "o"),
        ("compile", "x.py:build", "--target", "imxrt700", "--option", "novalue", "-o", "o"),
        ("compile", "x.py:build", "--memory-budget", "lots", "-o", "o"),
        ("compile", "x.py:build", "--no-such-flag", "-o", "o"),
        ("codegen", "m.pte", "-o", "g", "--libraries", "cmsis_dsp"),
        ("verify", "model.pte"),
        ("verify", "model.pte", "--model", "x.py:build"),
        ("verify", "out", "--target", "imxrt700"),
    ],
    ids=lambda a: " ".join(a[:4]),
)
def test_usage_errors_exit_2(args: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if args == USAGE_END_TO_END:  # as a shell runs it
        proc = _etforge(*args, cwd=tmp_path, env=_env(tmp_path))
    else:  # click's usage errors are the same in this process (issue 47: a program each before)
        monkeypatch.chdir(tmp_path)
        proc = cli_in_process(*args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert not (tmp_path / "o").exists()


def test_readme_lists_only_options_the_cli_has() -> None:
    readme = (REPO / "README.md").read_text()
    checked = 0
    for cell in re.findall(r"^\| `etforge (\w[\w-]*) ([^`]*)`", readme, re.MULTILINE):
        command, usage = cell
        options = set(re.findall(r"--[a-z][a-z-]*", usage))
        if not options:
            continue
        # click writes the same help in this process (issue 47: a program per command before)
        helptext = cli_in_process(command, "--help").stdout
        missing = [o for o in options if o not in helptext]
        assert not missing, f"README's etforge {command} lists {missing}, which the CLI does not have"
        checked += 1
    assert checked >= 5


API_SCRIPT = """
import logging, warnings
import torch
import etforge

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(16, 2)).eval()
example = (torch.randn(1, 3, 4, 4),)
compiled = etforge.compile(model, example, target="cortex-m33")
print("pte", len(compiled.pte))
warnings.warn("the user's own warning", UserWarning)
logging.getLogger("mine").warning("the user's own log")
"""


def test_the_python_api_is_as_quiet_as_the_cli() -> None:
    proc = subprocess.run([sys.executable, "-c", API_SCRIPT], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("pte ")
    # third-party chatter gone; the user's own warnings and logs (after the call) still shown
    rest = proc.stderr.replace("UserWarning: the user's own warning", "")
    assert not NOISE.search(rest), proc.stderr
    assert "the user's own warning" in proc.stderr and "the user's own log" in proc.stderr
