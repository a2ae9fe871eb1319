"""A local batch's jobs are forked from one server process that made a compile's imports once
(``cli/batch_server.py``), and each job is still a process of its own: a crash, a model's
module name and torch's process-wide state end with the job that caused them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import cli_in_process, run_cli

#: A model file's source: a factory that records what its process saw (pid, parent, the
#: parent's command line, torch's seed and thread count, whether a library op was still free
#: to define), then changes torch's process-wide state for whoever would run next.
NET = """
import json, os, sys
import torch

_LIBS = []


def _probe_and_change_state():
    first = torch.get_num_threads()
    lib = torch.library.Library("etforge_batch_fork_test", "DEF")
    try:
        lib.define("leak(Tensor a) -> Tensor")
        free = True
    except RuntimeError:
        free = False
    _LIBS.append(lib)
    torch.set_num_threads(first + 3)  # process-wide: must not reach the next job
    with open(os.environ["PROBE"], "a") as out:
        parent = open(f"/proc/{os.getppid()}/cmdline", "rb").read().split(b"\\0")
        out.write(json.dumps({"file": __file__, "pid": os.getpid(), "ppid": os.getppid(),
            "parent": [a.decode() for a in parent], "threads": first, "op_free": free,
            "seed": torch.initial_seed()}) + "\\n")


def FACTORY():
    if os.environ.get("PROBE"):  # in the batch (not in the test's own reference compile)
        _probe_and_change_state()
    torch.manual_seed(WIDTH)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, WIDTH, 3), torch.nn.ReLU()).eval()
    return model, (torch.randn(1, 3, 8, 8),)
"""


def test_jobs_are_forked_from_one_server_and_leak_nothing(tmp_path: Path) -> None:
    """Three jobs, one at a time: two model files both named ``net.py`` and one that aborts.
    Both nets are children of one ``--batch-fork-server`` process (not a fresh interpreter
    each); the second sees torch's default thread count, a fresh seed and an undefined op, not
    what the first left; the abort is ``killed by signal 6`` and the others still compile;
    the second's program is byte for byte a compile of it alone."""
    for name, factory, width in (("one", "f", 4), ("two", "g", 6)):
        (tmp_path / name).mkdir()
        source = NET.replace("FACTORY", factory).replace("WIDTH", str(width))
        (tmp_path / name / "net.py").write_text(source)
    (tmp_path / "crash.py").write_text("import os\n\n\ndef f():\n    os.abort()\n")
    probe = tmp_path / "probe.jsonl"
    models = [
        str(tmp_path / "one" / "net.py:f"),
        str(tmp_path / "crash.py:f"),
        str(tmp_path / "two" / "net.py:g"),
    ]
    manifest = tmp_path / "m.json"
    manifest.write_text(json.dumps({"jobs": [{"model": m, "target": "cortex-m33"} for m in models]}))
    env = {"PROBE": str(probe), "ETFORGE_NO_CACHE": "1"}
    proc = run_cli(
        "compile", "--manifest", str(manifest), "-o", str(tmp_path / "out"), "--jobs", "1", env=env
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    text = proc.stdout + proc.stderr
    assert "2 of 3 compiled" in text and "killed by signal 6" in text, text
    seen = [json.loads(line) for line in probe.read_text().splitlines()]
    assert [Path(s["file"]).parent.name for s in seen] == ["one", "two"]
    one, two = seen
    assert one["ppid"] == two["ppid"] and one["pid"] != two["pid"]
    assert "--batch-fork-server" in one["parent"], one["parent"]
    assert two["threads"] == one["threads"] and one["op_free"] and two["op_free"]
    assert one["seed"] != two["seed"]  # each job reseeded, as a fresh process is
    alone = run_cli("compile", models[2], "--target", "cortex-m33", "-o", str(tmp_path / "alone"),
                    env={"ETFORGE_NO_CACHE": "1"})  # fmt: skip
    assert alone.returncode == 0, alone.stdout + alone.stderr
    batch = (tmp_path / "out" / "net_g" / "cortex-m33" / "model.pte").read_bytes()
    assert (tmp_path / "alone" / "model.pte").read_bytes() == batch
    assert (tmp_path / "out" / "net_f" / "cortex-m33" / "model.pte").read_bytes() != batch


def test_without_fork_each_job_is_a_subprocess_and_the_summary_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where ``os.fork`` is missing the batch runs today's subprocesses and says so once (two
    jobs whose model files do not exist: each child fails fast, before importing torch)."""
    from etforge.core.batch import run as batch

    monkeypatch.setattr(batch, "NO_FORK_NOTE", "no os.fork here: each job a fresh process")
    proc = cli_in_process("compile", str(tmp_path / "a.py:f"), str(tmp_path / "b.py:f"), "--target",
                          "cortex-m33", "-o", str(tmp_path / "out"), "--jobs", "2")  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.count("note: no os.fork here: each job a fresh process") == 1, proc.stderr
    assert "0 of 2 compiled" in proc.stdout + proc.stderr and "a.py" in proc.stdout + proc.stderr
