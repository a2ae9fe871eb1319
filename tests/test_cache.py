"""The build cache: content-addressed keys, byte-identical restores, corrupt entries rebuilt."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from etforge.core.cache import BuildCache, build_key

from support import REPO, run_cli

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
    cache = BuildCache(tmp_path / "cache")
    cache.store("ab" * 32, src)
    dest = tmp_path / "dest"
    dest.mkdir()
    assert cache.restore("ab" * 32, dest)
    assert (dest / "model.pte").read_bytes() == (src / "model.pte").read_bytes()
    assert (dest / "sub" / "a.c").read_text() == "int a;\n"
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
    removed = cache.prune(max_bytes=2500)
    assert [e.key for e in removed] == ["11" * 32]
    assert sorted(e.key for e in cache.entries()) == ["22" * 32, "33" * 32]
    assert len(cache.prune(max_bytes=0)) == 2 and cache.entries() == []


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def test_unchanged_model_recompiles_from_the_cache_byte_identical(tmp_path: Path) -> None:
    env = {"ETFORGE_NO_CACHE": "0", "ETFORGE_CACHE_DIR": str(tmp_path / "cache")}
    first = run_cli("compile", MODEL, "--target", "imxrt700", "-o", str(tmp_path / "a"), env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "from the build cache" not in first.stdout
    second = run_cli("compile", MODEL, "--target", "imxrt700", "-o", str(tmp_path / "b"), env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "from the build cache" in second.stdout
    a, b = _files(tmp_path / "a"), _files(tmp_path / "b")
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
    from etforge.core.compiler import compile_model
    from etforge.core.plugin_manager import registry

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
