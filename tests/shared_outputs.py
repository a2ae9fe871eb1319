"""One ``etforge compile`` per session for an output several test files read (issue 47).

Several files compile the same model for the same target with the same command only to read what
it wrote: ``zoo:digits_cnn`` for cortex-m33 in five files (the firmware ones, the memory map's,
the C API's); ``user_models.py:small`` for each target in test_compile_cli.py,
test_verify_artifact.py, test_verify_imports.py, test_verify_deferred_torchao.py and
test_cmake.py; the same with the SDK double for imxrt700 (a process of its own, ~8 CPU s) in
test_cmake.py, test_sdk_path.py and test_firmware_npu.py. The first run of a command in the
session compiles into a directory every worker of the session sees (the parent of the xdist
workers' temporary directories); each later run copies that output to its own ``-o`` directory,
which the test may then change. The key is the command with its ``-o`` value left out, the
environment the command is given and every ``ETFORGE_*`` variable of this process; the files
written do not name their directory (``test_shared_outputs.py`` checks; the command's messages
do, and are rewritten to name the copy), and the code cannot change within one session, so a
copy is what a compile would have written. Nothing is kept across sessions: a new session is a
new directory. The commands a test is about (its output, its exit code, the cache, a batch) keep
running themselves.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

#: The session's shared directory (conftest's ``_shared_outputs`` fixture sets it); None: no
#: sharing (a helper used outside pytest), every command runs.
ROOT: list[Path | None] = [None]


def _key(args: list[str], pythonpath: Path | None, env: dict[str, str]) -> str:
    named = {k: v for k, v in os.environ.items() if k.startswith("ETFORGE_")}
    text = json.dumps([args, str(pythonpath), sorted(env.items()), sorted(named.items())])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def compile_once(
    *args: str, out: Path, pythonpath: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``etforge compile ARGS -o OUT`` (``support.run_cli``'s way), or a copy of the same
    command's output when another test of the session ran it; a failed compile is never kept."""
    from support import run_cli

    env = dict(env or {})
    root = ROOT[0]
    if root is None:
        return run_cli("compile", *args, "-o", str(out), pythonpath=pythonpath, env=env)
    key = _key(list(args), pythonpath, env)
    root.mkdir(parents=True, exist_ok=True)
    kept, told = root / key / "out", root / key / "proc.json"
    with (root / f"{key}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker compiling it: wait for its output
        if not told.is_file():
            proc = run_cli("compile", *args, "-o", str(kept), pythonpath=pythonpath, env=env)
            if proc.returncode != 0:
                shutil.rmtree(root / key, ignore_errors=True)
                return proc
            told.write_text(json.dumps([proc.args, proc.returncode, proc.stdout, proc.stderr]))
    shutil.copytree(kept, out, dirs_exist_ok=True)
    cmd, code, stdout, stderr = json.loads(told.read_text())
    here = [str(out) if a == str(kept) else a for a in cmd]
    return subprocess.CompletedProcess(
        here, code, stdout.replace(str(kept), str(out)), stderr.replace(str(kept), str(out))
    )
