"""The build cache: content-addressed keys, byte-identical restores, corrupt entries rebuilt."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from etforge.core.cache.store import BuildCache, build_key

from support import REPO, run_cli, run_cli_recording_modules

MODEL = str(REPO / "tests" / "models" / "user_models.py") + ":small"


def _key(program: torch.export.ExportedProgram, calib: list, **over: object) -> str:
    kw: dict = dict(
        model="m",
        target="imxrt700",
        options={"a": 1},
        flags={"float": False},
        plugins=[("etforge", "0.1.0")],
        npu_compiler="absent",
    )
    kw.update(over)
    return build_key(program, (torch.ones(1, 4),), calib, **kw)


def _program(weight: float) -> torch.export.ExportedProgram:
    lin = torch.nn.Linear(4, 2)
    with torch.no_grad():
        lin.weight.fill_(weight)
        lin.bias.fill_(0.125)
    return torch.export.export(lin.eval(), (torch.ones(1, 4),), strict=False)


def test_key_changes_with_everything_that_determines_the_output() -> None:
    calib = [(torch.zeros(1, 4),)]
    base = _key(_program(0.5), calib)
    assert base == _key(_program(0.5), calib)  # deterministic
    changed = {
        "weights": _key(_program(0.25), calib),
        "calibration": _key(_program(0.5), [(torch.ones(1, 4),)]),
        "target": _key(_program(0.5), calib, target="cortex-m33"),
        "options": _key(_program(0.5), calib, options={"a": 2}),
        "flags": _key(_program(0.5), calib, flags={"float": True}),
        "plugins": _key(_program(0.5), calib, plugins=[("etforge", "0.1.0"), ("x", "1")]),
        "npu compiler": _key(_program(0.5), calib, npu_compiler="eiq 3.0"),
        "model": _key(_program(0.5), calib, model="n"),
    }
    assert all(k != base for k in changed.values()), [n for n, k in changed.items() if k == base]


def test_store_restore_is_byte_identical_and_corruption_is_never_trusted(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "model.pte").write_bytes(bytes(range(256)) * 10)
    (src / "sub" / "a.c").write_text("int a;\n")
    (src / "partitions").mkdir()  # empty (a CPU-only target's): restored as well
    cache = BuildCache(tmp_path / "cache")
    cache.store("ab" * 32, src)
    dest = tmp_path / "dest"
    dest.mkdir()
    assert cache.restore("ab" * 32, dest)
    assert (dest / "model.pte").read_bytes() == (src / "model.pte").read_bytes()
    assert (dest / "sub" / "a.c").read_text() == "int a;\n"
    assert sorted(p.name for p in dest.iterdir()) == ["model.pte", "partitions", "sub"]
    assert not cache.restore("cd" * 32, tmp_path / "nowhere")  # a miss

    entry = next(cache.root.glob("*/" + "ab" * 32))
    blob = entry / "files" / "model.pte"
    data = bytearray(blob.read_bytes())
    data[100] ^= 0xFF
    blob.write_bytes(bytes(data))
    again = tmp_path / "again"
    again.mkdir()
    assert not cache.restore("ab" * 32, again)  # a flipped byte: ignored ...
    assert not entry.exists()  # ... and the entry is gone, to be rebuilt
    assert list(again.iterdir()) == []

    cache.store("ef" * 32, src)
    (next(cache.root.glob("*/" + "ef" * 32)) / "manifest.json").write_text("{not json")
    assert not cache.restore("ef" * 32, again)


def test_prune_removes_least_recently_used_first(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"x" * 1000)
    cache = BuildCache(tmp_path / "cache")
    for i, key in enumerate(("11" * 32, "22" * 32, "33" * 32)):
        cache.store(key, src)
        manifest = next(cache.root.glob(f"*/{key}/manifest.json"))
        os.utime(manifest, (1000 + i, 1000 + i))
    per_entry = cache.entries()[0].bytes
    removed, errors = cache.prune(max_bytes=2 * per_entry + per_entry // 2)
    assert [e.key for e in removed] == ["11" * 32]
    assert sorted(e.key for e in cache.entries()) == ["22" * 32, "33" * 32]
    assert errors == [] and len(cache.prune(max_bytes=0)[0]) == 2 and cache.entries() == []


def _files(out: Path) -> dict[str, bytes]:
    """Every output file's bytes; report.json without its ``cache`` entry (how the cache
    answered is the one thing a restored build reports differently)."""
    files = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    if "report.json" in files:
        report = json.loads(files["report.json"])
        assert report.pop("cache")["mode"] in ("direct", "exported", "miss")
        files["report.json"] = json.dumps(report).encode()
    return files


def cache_mode(out: Path) -> str:
    return json.loads((out / "report.json").read_text())["cache"]["mode"]


def test_unchanged_model_recompiles_from_the_cache_byte_identical(tmp_path: Path) -> None:
    env = {"ETFORGE_NO_CACHE": "0", "ETFORGE_CACHE_DIR": str(tmp_path / "cache")}
    first = run_cli("compile", MODEL, "--target", "imxrt700", "-o", str(tmp_path / "a"), env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "from the build cache" not in first.stdout
    second = run_cli("compile", MODEL, "--target", "imxrt700", "-o", str(tmp_path / "b"), env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "from the build cache" in second.stdout
    a, b = _files(tmp_path / "a"), _files(tmp_path / "b")
    # A factory's build is answered by the key of its exported program (docs/batch.md: the trust model).
    assert (cache_mode(tmp_path / "a"), cache_mode(tmp_path / "b")) == ("miss", "exported")
    assert a.keys() == b.keys() and "model.pte" in a
    assert all(a[k] == b[k] for k in a), [k for k in a if a[k] != b[k]]
    assert json.loads(b["report.json"])["pte_sha256"]

    # --no-cache compiles afresh; the same bytes come out.
    fresh = run_cli(
        "compile", MODEL, "--target", "imxrt700", "-o", str(tmp_path / "c"), "--no-cache", env=env
    )
    assert fresh.returncode == 0 and "from the build cache" not in fresh.stdout
    assert _files(tmp_path / "c")["model.pte"] == a["model.pte"]

    # Another option is another build.
    other = run_cli(
        "compile", MODEL, "--target", "imxrt700", "-o", str(tmp_path / "d"),
        "--option", "min_partition_ops=2", env=env,
    )  # fmt: skip
    assert other.returncode == 0 and "from the build cache" not in other.stdout

    # A corrupt entry is rebuilt, never trusted.
    for blob in (tmp_path / "cache").rglob("model.pte"):
        blob.write_bytes(b"corrupt")
    rebuilt = run_cli("compile", MODEL, "--target", "imxrt700", "-o", str(tmp_path / "e"), env=env)
    assert rebuilt.returncode == 0 and "from the build cache" not in rebuilt.stdout
    assert _files(tmp_path / "e")["model.pte"] == a["model.pte"]


@pytest.mark.parametrize(
    "argv", [("cache", "info"), ("cache", "prune", "--max-size", "0"), ("cache", "clear")]
)
def test_cache_commands(tmp_path: Path, argv: tuple[str, ...]) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"x")
    BuildCache(tmp_path / "cache").store("44" * 32, src)
    proc = run_cli(*argv, env={"ETFORGE_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert str(tmp_path / "cache") in proc.stdout
    if argv[1] != "info":
        assert BuildCache(tmp_path / "cache").entries() == []


def test_bad_prune_size_is_a_usage_error(tmp_path: Path) -> None:
    proc = run_cli("cache", "prune", "--max-size", "lots", env={"ETFORGE_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 2 and "lots" in proc.stderr


def test_build_only_options_change_neither_the_pte_nor_the_key() -> None:
    from etforge.core.build.session import compile_model
    from etforge.core.registry.manager import registry

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
    x = (torch.randn(1, 8),)
    target = registry().target("imxrt700")
    assert not target.output_options({"npu_timeout": 5}) and target.output_options({"a": 1}) == {"a": 1}
    ptes = [
        compile_model(module, x, target, calibration=[x], options=opts).pte
        for opts in ({}, {"npu_timeout": 5})
    ]
    assert ptes[0] == ptes[1]
    assert b"npu_timeout" not in ptes[0]


# --- direct mode: a recompile answered before torch is imported -------------------------------

#: A tiny model that reads its weights with torch.load; SEED sets its calibration data.
DIRECT_MODEL = """
from pathlib import Path

import torch

SEED = 0


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 4 * 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))


def build():
    net = Net()
    net.load_state_dict(torch.load(Path(__file__).with_name("weights.pt"), weights_only=True))
    g = torch.Generator().manual_seed(SEED)
    calib = [(torch.randn(1, 3, 4, 4, generator=g),) for _ in range(4)]
    return net.eval(), (torch.randn(1, 3, 4, 4, generator=g),), calib
"""

#: The stacks a cache hit has no need to import.
HEAVY = ("torch", "executorch", "torchao", "ai_edge_litert")

#: Longer than direct mode's allowance for coarse file times (50 ms): a file written this
#: long before a recording started is not taken as changed during it.
SETTLE = 0.2


def _weights(path: Path, value: float) -> None:
    torch.manual_seed(0)
    conv, fc = torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Linear(4 * 4 * 4, 3)
    state = {f"conv.{k}": v for k, v in conv.state_dict().items()}
    state |= {f"fc.{k}": v for k, v in fc.state_dict().items()}
    state["conv.weight"] = state["conv.weight"] * value
    torch.save(state, path)


class _Direct:
    """Runs ``etforge compile`` on the tiny model, noting which stacks each process imported."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.model = tmp / "net.py"
        self.model.write_text(DIRECT_MODEL)
        _weights(tmp / "weights.pt", 1.0)
        self.runs = 0

    def compile(self) -> tuple[subprocess.CompletedProcess[str], dict[str, bytes], list[str]]:
        self.runs += 1
        out = self.tmp / f"out{self.runs}"
        env = {"ETFORGE_NO_CACHE": "0", "ETFORGE_CACHE_DIR": str(self.tmp / "cache")}
        spec = f"{self.model}:build"
        proc, modules = run_cli_recording_modules(
            self.tmp / "probe", "compile", spec, "--target", "imxrt700cm", "-o", str(out), "--cache", "direct",
            env=env,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc, _files(out), [m for m in HEAVY if m in modules]


def _direct_manifests(cache_dir: Path) -> list[Path]:
    return sorted(cache_dir.glob("v*/direct/*/*.json"))


def test_direct_mode_recompiles_without_importing_torch(tmp_path: Path) -> None:
    d = _Direct(tmp_path)
    first, built, imported = d.compile()
    assert "from the build cache" not in first.stdout and "torch" in imported  # it did import torch
    assert "model.pte" in built and any(k.endswith(".tflite") for k in built)
    assert any(k.startswith("codegen/") and k.endswith((".c", ".cpp", ".h")) for k in built)

    hit, again, imported = d.compile()
    assert "from the build cache" in hit.stdout
    assert imported == [], f"the cache hit imported {imported}: {hit.stdout}"
    assert again == built  # byte for byte: .pte, .tflite, generated C, report
    assert "on imxrt700cm" in hit.stdout  # the summary, read from the restored report.json

    # Touched, same bytes: still answered directly.
    for f in (d.model, tmp_path / "weights.pt"):
        os.utime(f, (f.stat().st_atime + 100, f.stat().st_mtime + 100))  # even into the future
    hit, again, imported = d.compile()
    assert "from the build cache" in hit.stdout and imported == [] and again == built

    # A corrupt manifest is ignored (the full key answers, after torch), then rewritten.
    (manifest,) = _direct_manifests(tmp_path / "cache")
    manifest.write_text(manifest.read_text().replace('"sha256"', '"sha257"', 1))
    slow, again, imported = d.compile()
    assert "from the build cache" in slow.stdout and "torch" in imported and again == built
    why = json.loads((tmp_path / f"out{d.runs}" / "report.json").read_text())["cache"]
    assert "direct mode on for the next compile" in why["reason"], why  # the manifest rewritten
    hit, again, imported = d.compile()
    assert "from the build cache" in hit.stdout and imported == [] and again == built

    # Other weights read through torch.load: a miss, and other bytes.
    _weights(tmp_path / "weights.pt", 0.5)
    miss, reweighted, imported = d.compile()
    assert "from the build cache" not in miss.stdout and "torch" in imported
    assert reweighted["model.pte"] != built["model.pte"]

    # An edited model file (same size, other calibration data): a miss, and other bytes.
    _weights(tmp_path / "weights.pt", 1.0)
    d.model.write_text(DIRECT_MODEL.replace("SEED = 0", "SEED = 7"))
    miss, edited, imported = d.compile()
    assert "from the build cache" not in miss.stdout and "torch" in imported
    assert edited["model.pte"] != built["model.pte"]


#: Records in a child process: an audit hook stays for the life of its process, and the test
#: process should not pay for it in every later test.
RECORD = """
import importlib.metadata, json, os, sys
from pathlib import Path
from etforge.core.cache.direct import Recorder

tmp = Path(sys.argv[1])
data, low, gone = tmp / "data.bin", tmp / "low.bin", tmp / "gone.bin"
sys.path.insert(0, str(tmp))
rec = Recorder(exclude=[tmp / "private"])
with rec.recording():
    data.read_bytes()  # builtin open
    os.close(os.open(low, os.O_RDONLY))  # os.open
    (tmp / "out.bin").write_bytes(b"written")  # written by the build: not an input
    (tmp / "out.bin").read_bytes()
    gone.read_bytes()
    gone.unlink()  # a temporary
    (tmp / "private").mkdir()
    (tmp / "private" / "p.bin").write_bytes(b"p")
    (tmp / "private" / "p.bin").read_bytes()
    Path(json.__file__).read_bytes()  # the interpreter's own files
    json.__loader__.get_data(json.__file__)  # (io.open_code, as imports read)
    import pkg_direct_probe  # a module the model imports
    # etforge's entry points (in a checkout's etforge.egg-info when installed editable): in the
    # front key, and rewritten by any reinstall while a build may be reading them
    importlib.metadata.distribution("etforge").read_text("entry_points.txt")
first = rec.dependencies()
with rec.recording():
    data.read_bytes()
    os.utime(data)  # changed while the build ran
print(json.dumps({"first": first, "changed": rec.dependencies()}))
"""


def test_recorder_keeps_what_the_build_read_and_nothing_else(tmp_path: Path) -> None:
    (tmp_path / "data.bin").write_bytes(b"abc")
    (tmp_path / "low.bin").write_bytes(b"x")
    (tmp_path / "gone.bin").write_bytes(b"temporary")
    (tmp_path / "pkg_direct_probe.py").write_text("VALUE = 1\n")
    time.sleep(SETTLE)  # older than the recording: not "changed while the build ran"
    proc = subprocess.run(
        [sys.executable, "-c", RECORD, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    wanted = (tmp_path / "data.bin", tmp_path / "low.bin", tmp_path / "pkg_direct_probe.py")
    hashed = sorted(k for k, v in got["first"].items() if "sha256" in v)
    assert hashed == sorted(str(p.resolve()) for p in wanted)
    assert (
        got["first"][str((tmp_path / "data.bin").resolve())]["sha256"] == hashlib.sha256(b"abc").hexdigest()
    )
    assert got["changed"] is None  # its hash may not be what the build read


def test_direct_manifest_trusts_only_unchanged_files_and_intact_manifests(tmp_path: Path) -> None:
    from etforge.core.cache.direct import DirectCache, file_facts

    dep = tmp_path / "dep.txt"
    dep.write_text("one")
    time.sleep(SETTLE)  # as a recording requires: a later write cannot share its ctime
    files = {str(dep): file_facts(str(dep))}
    direct = DirectCache(BuildCache(tmp_path / "cache"))
    front, build = "ab" * 32, "cd" * 32
    direct.save(front, build, files, {"torch": torch.__version__.split("+")[0] + "-other"})
    assert direct.lookup(front) is None  # another version of a distribution the model imported
    direct.save(front, build, files, {})
    assert direct.lookup(front) == build
    assert direct.lookup("ef" * 32) is None  # no manifest

    os.utime(dep, (1, 2))  # touched, same bytes
    assert direct.lookup(front) == build
    dep.write_text("two")  # same size, other bytes
    assert direct.lookup(front) is None
    dep.write_text("one")
    assert direct.lookup(front) == build
    dep.write_text("three")
    assert direct.lookup(front) is None

    dep.write_text("one")
    (manifest,) = _direct_manifests(tmp_path / "cache")
    data = json.loads(manifest.read_text())
    data["body"]["build_key"] = "00" * 32  # a flipped byte: the checksum no longer matches
    manifest.write_text(json.dumps(data))
    assert direct.lookup(front) is None  # a corrupt manifest is never trusted
    manifest.write_text("{")
    assert direct.lookup(front) is None
    dep.unlink()
    direct.save(front, build, files, {})
    assert direct.lookup(front) is None  # a dependency that is gone

    # Pruning keeps the manifests of the builds it keeps, and only those.
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"x")
    direct.build_cache.store(build, src)
    direct.build_cache.prune(max_bytes=1 << 20)
    assert len(_direct_manifests(tmp_path / "cache")) == 1
    direct.build_cache.prune(max_bytes=0)
    assert _direct_manifests(tmp_path / "cache") == []


DIGEST = "from etforge.core.cache.store import package_sources; print(package_sources())"


def test_every_etforge_source_is_in_the_key(tmp_path: Path) -> None:
    """An edit anywhere in etforge's code or templates is another build key (direct mode's front
    key too): proved on a copy of the package, edited file by file outside ``core/``."""
    top = {".git", ".pytest_cache", ".hypothesis", ".ruff_cache", "build", "out", "tests", "bench"}
    copy = tmp_path / "etforge"
    shutil.copytree(
        REPO,
        copy,
        ignore=lambda d, names: {
            n
            for n in names
            if n == "__pycache__" or (Path(d) == REPO and (n in top or n.startswith(".venv")))
        },
    )

    def digest() -> str:
        proc = subprocess.run(
            [sys.executable, "-c", DIGEST],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(tmp_path)},
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    seen = {digest()}
    template = sorted((copy / "codegen" / "templates").glob("*.j2"))[0]
    for edited in (template, copy / "cli" / "compile.py", copy / "runtime" / "verification" / "verify.py"):
        edited.write_text(edited.read_text() + "\n")  # one more newline: another file
        seen.add(digest())
    assert len(seen) == 4, f"an edit outside core/ left etforge's source digest unchanged: {seen}"
