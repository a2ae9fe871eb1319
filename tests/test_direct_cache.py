"""Direct mode is never stale: what a model read outside Python's ``open`` is an input too.

Each case is one the previous recorder missed (issue 25): a symlink re-pointed after the
build, weights read by ``torch.from_file`` / ``numpy.fromfile``, a file probed and found
absent, an environment variable, an optional import that failed; and reads nothing
observes (a child process, ctypes) make the build ineligible for direct mode instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from etforge.core.cache.direct import DirectCache
from etforge.core.cache.store import BuildCache

from support import run_cli

#: Longer than direct mode's allowance for coarse file times (as in test_cache.py).
SETTLE = 0.2

#: Runs a model-like factory under the recorder in a child process (an audit hook stays for
#: the life of its process) and prints what it recorded.
RECORD = """
import json, os, sys
from pathlib import Path
import numpy as np
import torch
from etforge.core.cache.direct import Recorder

tmp = Path(sys.argv[1])
sys.path.insert(0, str(tmp))
rec = Recorder()
with rec.recording():
    torch.load(tmp / "wcur.pt", weights_only=True)  # a symlink to w1.pt
    torch.from_file(str(tmp / "raw.bin"), size=4, dtype=torch.uint8)
    np.fromfile(tmp / "np.bin", dtype=np.uint8)
    torch.jit.load(str(tmp / "m.jit"))  # read by C++ from the path
    if os.path.exists(tmp / "override.pt"):
        raise SystemExit("override.pt must not exist yet")
    os.environ.get("ETFORGE_TEST_MODEL_SCALE")
    try:
        import etforge_test_optional_dependency  # noqa: F401
    except ImportError:
        pass
deps = rec.dependencies()
print(json.dumps({"deps": deps, "env": rec.environment(), "missing": rec.missing_modules(),
                  "ineligible": rec.ineligible}))
"""

#: Reads nothing observes: each makes the recording ineligible, with a reason.
OPAQUE = {
    "subprocess": "import subprocess; subprocess.run(['true'])",
    "ctypes": "import ctypes; ctypes.CDLL(None).getpid()",
    "environment": "dict(os.environ)",
    "rewrite": "data = open(STATE).read(); open(STATE, 'w').write(data + '1')",
}

OPAQUE_RUNNER = """
import os, sys, tempfile
from etforge.core.cache.direct import Recorder
STATE = os.path.join(tempfile.mkdtemp(), "state.txt")  # a file the model reads, then rewrites
open(STATE, "w").write("0")
rec = Recorder()
with rec.recording():
    exec(sys.argv[1])
print(rec.dependencies() is None, rec.ineligible)
"""


def _child(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ETFORGE_TEST_MODEL_SCALE"}
    return subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300, env=env
    )


def test_every_read_is_an_input_as_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    torch.save({"w": torch.ones(2)}, tmp_path / "w1.pt")
    torch.save({"w": torch.zeros(2)}, tmp_path / "w2.pt")
    (tmp_path / "wcur.pt").symlink_to("w1.pt")
    (tmp_path / "raw.bin").write_bytes(b"abcd")
    (tmp_path / "np.bin").write_bytes(b"wxyz")
    torch.manual_seed(0)
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(tmp_path / "m.jit"))
    time.sleep(SETTLE)
    proc = _child(RECORD, str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["ineligible"] is None and got["deps"] is not None
    deps = got["deps"]
    assert str(tmp_path / "wcur.pt") in deps  # the path as opened, not only its target
    assert deps[str(tmp_path / "override.pt")] == {"probe": "absent"}
    assert "ETFORGE_TEST_MODEL_SCALE" in got["env"] and got["env"]["ETFORGE_TEST_MODEL_SCALE"] is None
    assert "etforge_test_optional_dependency" in got["missing"]

    monkeypatch.delenv("ETFORGE_TEST_MODEL_SCALE", raising=False)
    direct = DirectCache(BuildCache(tmp_path / "cache"))
    front, build = "ab" * 32, "cd" * 32
    direct.save(front, build, deps, {}, got["env"], got["missing"])
    assert direct.lookup(front) == build, direct.why

    def stale(change: object, undo: object) -> str:
        change()  # type: ignore[operator]
        try:
            assert direct.lookup(front) is None, "a changed input was not noticed"
            return direct.why
        finally:
            undo()  # type: ignore[operator]
            assert direct.lookup(front) == build, direct.why

    link = tmp_path / "wcur.pt"
    why = stale(
        lambda: (link.unlink(), link.symlink_to("w2.pt")), lambda: (link.unlink(), link.symlink_to("w1.pt"))
    )
    assert "wcur.pt" in why
    assert "raw.bin" in stale(
        lambda: (tmp_path / "raw.bin").write_bytes(b"abce"),
        lambda: (tmp_path / "raw.bin").write_bytes(b"abcd"),
    )
    assert "np.bin" in stale(
        lambda: (tmp_path / "np.bin").write_bytes(b"wxyZ"), lambda: (tmp_path / "np.bin").write_bytes(b"wxyz")
    )
    assert "override.pt" in stale(
        lambda: (tmp_path / "override.pt").write_bytes(b"x"), lambda: (tmp_path / "override.pt").unlink()
    )
    assert "ETFORGE_TEST_MODEL_SCALE" in stale(
        lambda: monkeypatch.setenv("ETFORGE_TEST_MODEL_SCALE", "2"),
        lambda: monkeypatch.delenv("ETFORGE_TEST_MODEL_SCALE"),
    )
    jit_bytes = (tmp_path / "m.jit").read_bytes()
    torch.manual_seed(1)
    assert "m.jit" in stale(
        lambda: torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), str(tmp_path / "m.jit")),
        lambda: (tmp_path / "m.jit").write_bytes(jit_bytes),
    )
    optional = tmp_path / "etforge_test_optional_dependency.py"
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "etforge_test_optional_dependency" in stale(lambda: optional.write_text(""), optional.unlink)


@pytest.mark.parametrize("case", sorted(OPAQUE))
def test_reads_nothing_observes_make_the_build_ineligible(case: str) -> None:
    proc = _child(OPAQUE_RUNNER, OPAQUE[case])
    assert proc.returncode == 0, proc.stderr
    ineligible, _, why = proc.stdout.strip().partition(" ")
    assert ineligible == "True" and why and why != "None", proc.stdout


#: The issue's model: weights through a symlink the user re-points between compiles.
SYMLINK_MODEL = """
from pathlib import Path
import torch

def build():
    net = torch.nn.Linear(4, 3)
    net.load_state_dict(torch.load(Path(__file__).with_name("wcur.pt"), weights_only=True))
    g = torch.Generator().manual_seed(0)
    return net.eval(), (torch.randn(1, 4, generator=g),), [(torch.randn(1, 4, generator=g),) for _ in range(4)]
"""


def test_a_repointed_symlink_is_a_miss_end_to_end(tmp_path: Path) -> None:
    import torch

    for name, scale in (("w1.pt", 1.0), ("w2.pt", -3.0)):
        torch.manual_seed(0)
        torch.save({k: v * scale for k, v in torch.nn.Linear(4, 3).state_dict().items()}, tmp_path / name)
    (tmp_path / "wcur.pt").symlink_to("w1.pt")
    (tmp_path / "net.py").write_text(SYMLINK_MODEL)
    time.sleep(SETTLE)
    env = {"ETFORGE_NO_CACHE": "0", "ETFORGE_CACHE_DIR": str(tmp_path / "cache")}

    def compile_(out: str) -> dict[str, object]:
        spec = f"{tmp_path / 'net.py'}:build"
        # its own process, as users run it: direct mode answers before torch is imported, and an
        # in-process run inherits what the test process's torch put in os.environ
        proc = run_cli(
            "compile", spec, "-o", str(tmp_path / out), "--cache", "direct", env=env, subprocess_only=True
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        report = json.loads((tmp_path / out / "report.json").read_text())
        assert f"cache: {report['cache']['mode']}" in proc.stdout  # the summary says it too
        return report

    assert compile_("a")["cache"]["mode"] == "miss"
    b = compile_("b")
    assert b["cache"]["mode"] == "direct", b["cache"]
    (tmp_path / "wcur.pt").unlink()
    (tmp_path / "wcur.pt").symlink_to("w2.pt")
    again = compile_("c")
    assert again["cache"]["mode"] == "miss", again["cache"]
    assert "wcur.pt" in again["cache"]["reason"]
    assert (tmp_path / "c" / "model.pte").read_bytes() != (tmp_path / "a" / "model.pte").read_bytes()
