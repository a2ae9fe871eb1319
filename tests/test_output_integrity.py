"""OUT is replaced whole: a failed or killed compile leaves the old complete output or the new one.

The swap itself is exercised in child processes that die (``os._exit``, as SIGKILL would) at
each point of it, through the atomic exchange and through the two-rename fallback; the
whole compile is killed the same way (the child wraps the writer's functions, :data:`DIE_AT`:
production code has no test hook) and with a real SIGKILL while it writes.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from support import REPO

MODEL = str(REPO / "tests" / "models" / "user_models.py")

OLD = {
    "model.pte": b"old program",
    "report.json": b'{"model": "old"}',
    "model.etrecord": b"old etrecord",
    "codegen/etforge_model.h": b"#define kPteSize 11",
    "partitions/etforge_0.tflite": b"old partition",
    "partitions/etforge_1.tflite": b"old second partition",
}
NEW = {
    "model.pte": b"new program!",
    "report.json": b'{"model": "new"}',
    "codegen/etforge_model.h": b"#define kPteSize 12",
    "partitions/etforge_0.tflite": b"new partition",
}

# What a child runs first to die, as a SIGKILL would (``os._exit(137)``), at one point of
# writing the output: it wraps the output module's own calls (its ``os.rename``,
# ``_exchange``, ``shutil.rmtree``, ``commit``, ``write_outputs``), so the point is where the
# writer is, with no hook in production code. Points: "staged" (staging complete, before the
# first rename or exchange), "swap" (two-rename path: between moving OUT aside and moving the
# new output in), "swapped" (the new output in place, the old not yet deleted), "pte"
# (model.pte written, before codegen and the swap).
DIE_AT = """
import os, types
from etforge.core.build import output


def die_at(point):
    calls = {"rename": 0}
    real_rename, real_rmtree, real_exchange = output.os.rename, output.shutil.rmtree, output._exchange
    real_commit, real_write = output.commit, output.write_outputs

    def rename(a, b):
        calls["rename"] += 1
        if point == "staged" and calls["rename"] == 1 or point == "swap" and calls["rename"] == 3:
            os._exit(137)
        return real_rename(a, b)

    def exchange(a, b):
        if point == "staged":
            os._exit(137)
        return real_exchange(a, b)

    def rmtree(*a, **k):
        if point == "swapped":
            os._exit(137)
        return real_rmtree(*a, **k)

    def commit(staging, out):
        real_commit(staging, out)
        if point == "swapped":  # the fresh path deletes nothing after its one rename
            os._exit(137)

    def write_outputs(*a, **k):
        real_write(*a, **k)
        if point == "pte":
            os._exit(137)

    output.os = types.SimpleNamespace(**{**vars(os), "rename": rename})
    output.shutil = types.SimpleNamespace(**{**vars(output.shutil), "rmtree": rmtree})
    output._exchange, output.commit, output.write_outputs = exchange, commit, write_outputs
"""

# A child that stages NEW and commits it, dying at ``kill_at`` ("writing": halfway through
# staging, before any swap; the others: DIE_AT's points).
CHILD = (
    DIE_AT
    + """
import sys
from pathlib import Path

out, exchange, new, kill_at = Path(sys.argv[1]), sys.argv[2] == "1", eval(sys.argv[3]), sys.argv[4]
if not exchange:
    output._exchange = lambda a, b: False  # a file system without renameat2 exchange
if kill_at not in ("", "writing"):
    die_at(kill_at)
staging = output.prepare(out)
for i, (name, data) in enumerate(sorted(new.items())):
    (staging / name).parent.mkdir(parents=True, exist_ok=True)
    (staging / name).write_bytes(data)
    if i == 1 and kill_at == "writing":
        os._exit(137)
output.commit(staging, out)
"""
)

# ``etforge`` on the command line, dying at DIE_AT's point ``sys.argv[1]``.
CLI = (
    DIE_AT
    + """
import sys

die_at(sys.argv.pop(1))
from etforge.cli import run

sys.argv[0] = "etforge"
run()
"""
)


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)


def siblings(out: Path) -> list[str]:
    return sorted(
        p.name for p in out.parent.iterdir() if re.match(rf"{re.escape(out.name)}\.(tmp|new|old)-", p.name)
    )


def run_child(out: Path, exchange: bool, kill_at: str | None) -> int:
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(out), "1" if exchange else "0", repr(NEW), kill_at or ""],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode in (0, 137), proc.stderr
    return proc.returncode


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "two-renames"])
@pytest.mark.parametrize("kill_at", [None, "writing", "staged", "swap", "swapped"])
@pytest.mark.parametrize("had_output", [True, False], ids=["replacing", "fresh"])
def test_a_kill_anywhere_leaves_old_or_new_complete(
    tmp_path: Path, exchange: bool, kill_at: str | None, had_output: bool
) -> None:
    from etforge.core.build import output

    out = tmp_path / "out"
    if had_output:
        write_tree(out, OLD)
    rc = run_child(out, exchange, kill_at)
    # every point is reached, except "swap" outside the two-rename replacement of an output
    reached = kill_at is not None and (kill_at != "swap" or (not exchange and had_output))
    assert rc == (137 if reached else 0), (kill_at, rc)
    before = OLD if had_output else None
    state = tree(out) if out.exists() else None
    if state not in (before, NEW):
        # only the two-rename fallback has a window without OUT; its new output is complete
        assert (exchange, kill_at, state) == (False, "swap", None), (rc, state)
        assert [s.split("-")[0] for s in siblings(out)] == ["out.new", "out.old"]
    if (exchange, kill_at, had_output) == (False, "swap", True):
        assert state is None  # the window between the two renames was really hit
    output.recover(out)  # what the next compile (and report, verify) does first
    assert (tree(out) if out.exists() else None) in (before, NEW)
    assert siblings(out) == []
    if rc == 0:
        assert tree(out) == NEW  # nothing of the old output survives (etrecord, partitions)


def test_failed_staging_leaves_nothing_and_old_output_intact(tmp_path: Path) -> None:
    from etforge.core.build import output

    out = tmp_path / "out"
    write_tree(out, OLD)
    with pytest.raises(RuntimeError), output.replacing(out) as staging:
        (staging / "model.pte").write_bytes(b"half")
        raise RuntimeError("conversion failed")
    assert tree(out) == OLD and siblings(out) == []
    fresh = tmp_path / "fresh"
    with pytest.raises(RuntimeError), output.replacing(fresh) as staging:
        (staging / "model.pte").write_bytes(b"half")
        raise RuntimeError("conversion failed")
    assert not fresh.exists() and siblings(fresh) == []


def test_recover_leaves_a_live_runs_staging_alone(tmp_path: Path) -> None:
    from etforge.core.build import output

    out = tmp_path / "out"
    live = tmp_path / f"out.tmp-{os.getpid()}-abc123"  # this process: a compile in progress
    live.mkdir()
    output.recover(out)
    assert live.exists()


def test_output_that_is_not_ours_is_refused(tmp_path: Path) -> None:
    from etforge.core.build import output
    from etforge.core.common.errors import EtforgeError

    home = tmp_path / "home"
    write_tree(home, {"notes.txt": b"my notes", "src/main.c": b"int main;"})
    with pytest.raises(EtforgeError, match=r"home is not an etforge output \(notes.txt, src\)"):
        output.prepare(home)
    assert tree(home) == {"notes.txt": b"my notes", "src/main.c": b"int main;"} and siblings(home) == []


def test_the_users_own_entries_are_kept(tmp_path: Path) -> None:
    from etforge.core.build import output

    out = tmp_path / "out"
    write_tree(out, {**OLD, "gen/model.h": b"from etforge codegen -o out/gen"})
    with output.replacing(out) as staging:
        write_tree(staging, NEW)
    assert tree(out) == {**NEW, "gen/model.h": b"from etforge codegen -o out/gen"}


def test_staging_gets_the_usual_mode(tmp_path: Path) -> None:
    from etforge.core.build import output

    out = tmp_path / "fresh"
    with output.replacing(out) as staging:
        (staging / "model.pte").write_bytes(b"x")
    mask = os.umask(0)
    os.umask(mask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~mask


# --- the whole compile ------------------------------------------------------------------


def _cli(*args: str) -> None:
    """An in-process compile (this process already paid for importing torch)."""
    from etforge.cli import main

    result = CliRunner().invoke(main, ["-v", *args])  # -v: leave this process's logging alone
    assert result.exit_code == 0, result.output


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "COLUMNS": "200", **extra}


def _complete(out: Path) -> None:
    """model.pte, report, partitions and codegen of one compile, consistent with each other."""
    import hashlib
    import json

    report = json.loads((out / "report.json").read_text())
    pte = (out / "model.pte").read_bytes()
    assert hashlib.sha256(pte).hexdigest() == report["pte_sha256"]
    assert sorted(p.name for p in (out / "partitions").glob("*.tflite")) == sorted(
        Path(p["tflite"]).name for p in report["partitions"]
    )
    header = next((out / "codegen").glob("*.h")).read_text()
    assert re.search(rf"\b{len(pte)}\b", header), "codegen/ is not this model.pte's"


@pytest.fixture(scope="module")
def old_output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("old") / "out"
    _cli("compile", f"{MODEL}:small", "--target", "imxrt700cm", "--etrecord", "-o", str(base))
    _complete(base)
    return base


def test_compile_killed_then_recompiled(old_output: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    shutil.copytree(old_output, out)
    before = tree(out)
    cmd = [
        sys.executable,
        "-m",
        "etforge",
        "compile",
        f"{MODEL}:small",
        "--target",
        "imxrt700",
        "-o",
        str(out),
    ]
    # killed right after the new model.pte is written (before codegen and the swap)
    killed = [sys.executable, "-c", CLI, "pte", *cmd[3:]]
    proc = subprocess.run(killed, env=_env(), capture_output=True, timeout=900)
    assert proc.returncode == 137, proc.stderr
    assert tree(out) == before and siblings(out), "the old output changed or no staging was left"
    # a real SIGKILL while the compile writes its staging directory
    child = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 900
    while child.poll() is None and time.monotonic() < deadline:
        if any((out.parent / s / "partitions").exists() for s in siblings(out) if ".tmp-" in s):
            break
        time.sleep(0.02)
    child.send_signal(signal.SIGKILL)
    child.wait()
    if child.returncode == 0:  # it finished before the kill: the new output, complete
        _complete(out)
    else:
        assert tree(out) == before
    # the next compile recovers the leftovers and replaces everything: no stale etrecord
    _cli("compile", f"{MODEL}:small", "--target", "imxrt700", "-o", str(out))
    assert siblings(out) == []
    assert not (out / "model.etrecord").exists()
    _complete(out)
    assert tree(out)["model.pte"] != before["model.pte"]
