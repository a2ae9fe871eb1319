"""The default cache key is sound by construction: nothing a factory reads can make it stale.

Each model below reads an input in a way an observer of Python's file and environment calls
misses (issue 48): a config through ``sqlite3`` (C), weights through ``torch.export.load``
(C++), a file opened with ``os.open(name, dir_fd=...)``, a module that a later ``PYTHONPATH``
entry shadows, an environment variable read by an installed library, a module in a site
directory without package metadata edited in place, and a module whose unchecked ``.pyc``
changed under an unchanged ``.py``. After each input changes, a cached compile in the default
mode must give the bytes ``--no-cache`` gives, not the first build's.

Every case builds ``net(value)`` from the value its input holds, so the truth after the change
is one ``--no-cache`` compile of ``net(2.5)`` (in this process), not seven more compiles in
worker processes. Each cached compile is a batch job (``compile A B ... --jobs 2``): a process
of its own, started in the world's environment and forked from the batch's server after a
compile's imports (issue 47: 21 fresh children cost ~70 CPU s).
"""

from __future__ import annotations

import json
import os
import py_compile
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import torch

from support import run_cli

#: The tiny model every case builds: a seeded Linear whose weights are shifted by ``value``.
NET = """
import torch

def net(value):
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 3)
    with torch.no_grad():
        lin.weight.add_(float(value))
    g = torch.Generator().manual_seed(0)
    calib = [(torch.randn(1, 4, generator=g),) for _ in range(4)]
    return lin.eval(), (torch.randn(1, 4, generator=g),), calib
"""

#: The value every input holds after ``change_every_input`` (0.5 before).
CHANGED = "2.5"

CASES = {
    "sqlite": """
import sqlite3
from pathlib import Path
from tinynet import net

def build():
    con = sqlite3.connect(str(Path(__file__).with_name("cfg.db")))
    (value,) = con.execute("select v from cfg").fetchone()
    con.close()
    return net(value)
""",
    "exportload": """
from pathlib import Path
import torch
from tinynet import net

def build():
    ep = torch.export.load(str(Path(__file__).with_name("w.pt2")))
    return net(float(ep.state_dict["weight"].flatten()[0]))
""",
    "dirfd": """
import os
from pathlib import Path
from tinynet import net

def build():
    d = os.open(str(Path(__file__).parent / "cfgdir"), os.O_RDONLY)
    fd = os.open("value.txt", os.O_RDONLY, dir_fd=d)
    value = float(os.read(fd, 100))
    os.close(fd)
    os.close(d)
    return net(value)
""",
    "shadow": """
from tinynet import net
import h48_shadowed

def build():
    return net(h48_shadowed.VALUE)
""",
    "libenv": """
from tinynet import net
import h48_envlib

def build():
    return net(h48_envlib.value())
""",
    "sitemod": """
from tinynet import net
import h48_plain

def build():
    return net(h48_plain.VALUE)
""",
    "pyc": """
import importlib.util
from pathlib import Path
from tinynet import net

def build():
    spec = importlib.util.spec_from_file_location("h48_pyc", Path(__file__).with_name("h48_pyc.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return net(mod.VALUE)
""",
}


def _export_weights(path: Path, value: float) -> None:
    lin = torch.nn.Linear(1, 1)
    with torch.no_grad():
        lin.weight.fill_(value)
    torch.export.save(torch.export.export(lin, (torch.ones(1, 1),), strict=False), path)


def _unchecked_pyc(source: Path, text: str) -> None:
    """Compile ``text`` into ``source``'s cached bytecode, unchecked: Python loads it whatever
    the ``.py`` holds."""
    staged = source.with_name("staged_" + source.name)
    staged.write_text(text)
    py_compile.compile(
        str(staged),
        cfile=py_compile.importlib.util.cache_from_source(str(source)),  # type: ignore[attr-defined]
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )
    staged.unlink()


class _World:
    """The models, their inputs and the environment they run in (user site and PYTHONPATH)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.models = tmp / "models"
        self.early = tmp / "early"  # first on PYTHONPATH: empty until the shadowing module appears
        self.userbase = tmp / "userbase"
        v = f"python{sys.version_info.major}.{sys.version_info.minor}"
        self.site = self.userbase / "lib" / v / "site-packages"
        for d in (self.models, self.early, self.site, self.models / "cfgdir"):
            d.mkdir(parents=True, exist_ok=True)
        (self.models / "tinynet.py").write_text(NET)
        for name, code in CASES.items():
            (self.models / f"{name}.py").write_text(code)
        con = sqlite3.connect(self.models / "cfg.db")
        con.execute("create table cfg (v real)")
        con.execute("insert into cfg values (0.5)")
        con.commit()
        con.close()
        _export_weights(self.models / "w.pt2", 0.5)
        (self.models / "cfgdir" / "value.txt").write_text("0.5")
        (self.models / "h48_shadowed.py").write_text("VALUE = 0.5\n")
        (self.site / "h48_envlib.py").write_text(
            "import os\n\ndef value():\n    return float(os.environ.get('H48_LIB_VALUE', '0.5'))\n"
        )
        (self.site / "h48_plain.py").write_text("VALUE = 0.5\n")
        (self.models / "h48_pyc.py").write_text("VALUE = 0.5\n")
        _unchecked_pyc(self.models / "h48_pyc.py", "VALUE = 0.5\n")
        self.lib_value = "0.5"
        time.sleep(0.2)  # older than a recording's allowance for coarse file times

    def change_every_input(self) -> None:
        con = sqlite3.connect(self.models / "cfg.db")
        con.execute(f"update cfg set v = {CHANGED}")
        con.commit()
        con.close()
        _export_weights(self.models / "w.pt2", float(CHANGED))
        (self.models / "cfgdir" / "value.txt").write_text(CHANGED)
        (self.early / "h48_shadowed.py").write_text(f"VALUE = {CHANGED}\n")
        (self.site / "h48_plain.py").write_text(f"VALUE = {CHANGED}\n")  # no metadata: no version to change
        _unchecked_pyc(self.models / "h48_pyc.py", f"VALUE = {CHANGED}\n")  # the .py is untouched
        self.lib_value = CHANGED
        time.sleep(0.2)

    def truth(self, value: str) -> tuple[bytes, dict[str, str]]:
        """The ``--no-cache`` build of ``net(value)``, what every case builds once its input
        holds ``value``: one model that reads nothing, compiled in this process."""
        ref = self.tmp / "reference.py"
        ref.write_text(NET + f"\n\ndef build():\n    return net({value})\n")
        out = self.tmp / "truth"
        env = {"ETFORGE_NO_CACHE": "0", "ETFORGE_CACHE_DIR": str(self.tmp / "cache")}
        proc = run_cli("compile", f"{ref}:build", "-o", str(out), "--no-cache", env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        cache = json.loads((out / "report.json").read_text())["cache"]
        return (out / "model.pte").read_bytes(), cache

    def compile(self, out: str) -> Path:
        """Every case compiled as a job of one batch started in this world's environment (each
        job a process of its own, forked from the batch's server after a compile's imports)."""
        env = {
            "ETFORGE_NO_CACHE": "0",
            "ETFORGE_CACHE_DIR": str(self.tmp / "cache"),
            "PYTHONUSERBASE": str(self.userbase),
            "H48_LIB_VALUE": self.lib_value,
            "PYTHONPATH": os.pathsep.join(
                [str(self.early), str(self.models), str(self.site), os.environ.get("PYTHONPATH", "")]
            ),
        }
        specs = [f"{self.models / name}.py:build" for name in CASES]
        proc = run_cli("compile", *specs, "-o", str(self.tmp / out), "--jobs", "2", env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return self.tmp / out


def _pte(out: Path, name: str) -> bytes:
    return (out / f"{name}_build" / "imxrt700cm" / "model.pte").read_bytes()


def _cache(out: Path, name: str) -> dict[str, str]:
    return json.loads((out / f"{name}_build" / "imxrt700cm" / "report.json").read_text())["cache"]


def test_inputs_nothing_observes_never_give_a_stale_build(tmp_path: Path) -> None:
    world = _World(tmp_path)
    first = world.compile("first")
    assert {_cache(first, n)["mode"] for n in CASES} == {"miss"}
    again = world.compile("again")
    assert all(_pte(again, n) == _pte(first, n) for n in CASES)  # the cache answers the unchanged
    assert {_cache(again, n)["mode"] for n in CASES} == {"exported"}

    world.change_every_input()
    cached = world.compile("cached")
    fresh, fresh_cache = world.truth(CHANGED)
    assert fresh_cache["mode"] == "miss" and "off" in fresh_cache["reason"]
    for name in CASES:
        assert fresh != _pte(first, name), f"{name}: the change must change the build"
        assert _pte(cached, name) == fresh, f"{name}: stale ({_cache(cached, name)})"
        assert _cache(cached, name)["mode"] == "miss", name


def test_direct_mode_by_construction_for_pt2_and_zoo(tmp_path: Path) -> None:
    """A ``.pt2`` and a ``zoo:`` model are restored without a recorder: the program's bytes,
    etforge's sources and the modules an import could find first are the key."""
    env = {"ETFORGE_NO_CACHE": "0", "ETFORGE_CACHE_DIR": str(tmp_path / "cache")}
    work = tmp_path / "work"
    work.mkdir()

    def compile_(spec: str, out: str, *extra: str) -> dict[str, str]:
        proc = subprocess.run(
            [sys.executable, "-m", "etforge", "compile", spec, "-o", str(tmp_path / out), *extra],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            cwd=work,  # sys.path[0] for `python -m`
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads((tmp_path / out / "report.json").read_text())["cache"]

    def compile_here(spec: str, out: str, *extra: str) -> dict[str, str]:
        proc = run_cli("compile", spec, "-o", str(tmp_path / out), *extra, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads((tmp_path / out / "report.json").read_text())["cache"]

    # The .pt2 cases in this process: a .pt2's key is its bytes (the working directory and the
    # import path are the same for all three runs), and a direct restore in a fresh process,
    # before torch is imported, is the zoo cases' below (issue 47: a torch import per run).
    pt2 = tmp_path / "m.pt2"
    _export_weights(pt2, 0.5)
    assert compile_here(str(pt2), "p1")["mode"] == "miss"
    hit = compile_here(str(pt2), "p2")
    assert hit["mode"] == "direct" and ".pt2" in hit["reason"]
    _export_weights(pt2, 2.5)
    assert compile_here(str(pt2), "p3")["mode"] == "miss"
    # the truth, --no-cache: in this process (no import order or working directory to prove)
    proc = run_cli("compile", str(pt2), "-o", str(tmp_path / "p4"), "--no-cache", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "p3" / "model.pte").read_bytes() == (tmp_path / "p4" / "model.pte").read_bytes()
    assert (tmp_path / "p3" / "model.pte").read_bytes() != (tmp_path / "p1" / "model.pte").read_bytes()

    assert compile_("zoo:ds_cnn", "z1")["mode"] == "miss"
    assert compile_("zoo:ds_cnn", "z2")["mode"] == "direct"
    (work / "out_dir").mkdir()  # not importable: still answered directly
    assert compile_("zoo:ds_cnn", "z3")["mode"] == "direct"
    (work / "numpy_helpers.py").write_text("")  # a module the working directory now offers
    assert compile_("zoo:ds_cnn", "z4")["mode"] == "exported"
