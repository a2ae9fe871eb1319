"""The build cache is never trusted blindly, and its commands say what they really did.

An entry is sealed to the key it was stored under (its manifest names the key and every
file's digest), a restored report must describe the model, target and precision asked for,
and ``cache info|prune|clear`` list damaged entries, name what they could not remove and
exit 1 then (issue 25).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from etforge.core.cache import store as cache_mod
from etforge.core.cache.store import BuildCache
from etforge.core.common.digest import sha256_file

from support import run_cli

MODEL = """
import torch

def build():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU())
    g = torch.Generator().manual_seed(1)
    return net.eval(), (torch.randn(1, 8, generator=g),), [(torch.randn(1, 8, generator=g),) for _ in range(4)]
"""


def _entry(src: Path, text: bytes = b"x" * 100) -> Path:
    src.mkdir(exist_ok=True)
    (src / "model.pte").write_bytes(text)
    (src / "report.json").write_text("{}")
    return src


def test_an_entry_is_sealed_to_its_key(tmp_path: Path) -> None:
    c = BuildCache(tmp_path / "cache")
    key, other = "ab" * 32, "cd" * 32
    c.store(key, _entry(tmp_path / "src"))
    (tmp_path / "d1").mkdir()
    assert c.restore(key, tmp_path / "d1") and (tmp_path / "d1" / "model.pte").read_bytes() == b"x" * 100
    # The same files moved under another key (a copied or planted entry): not restored.
    entry = c.root / key[:2] / key
    (c.root / other[:2]).mkdir(parents=True, exist_ok=True)
    entry.rename(c.root / other[:2] / other)
    (tmp_path / "d2").mkdir()
    assert not c.restore(other, tmp_path / "d2") and "another key" in c.why
    assert not (c.root / other[:2] / other).exists()  # discarded
    # A manifest edited to list other digests without its seal: not restored.
    c.store(key, _entry(tmp_path / "src"))
    manifest = json.loads((entry / cache_mod.MANIFEST).read_text())
    (entry / "files" / "model.pte").write_bytes(b"y" * 100)
    manifest["files"]["model.pte"] = sha256_file(entry / "files" / "model.pte")
    (entry / cache_mod.MANIFEST).write_text(json.dumps(manifest))
    (tmp_path / "d3").mkdir()
    assert not c.restore(key, tmp_path / "d3") and "seal" in c.why and list((tmp_path / "d3").iterdir()) == []


def test_a_planted_entry_naming_another_model_is_not_restored(tmp_path: Path) -> None:
    (tmp_path / "net.py").write_text(MODEL)
    spec = f"{tmp_path / 'net.py'}:build"
    env = {"ETFORGE_NO_CACHE": "0", "ETFORGE_CACHE_DIR": str(tmp_path / "cache")}
    first = run_cli("compile", spec, "-o", str(tmp_path / "a"), env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    # Whoever can write the cache plants a report of another model under this build's key,
    # re-sealed so that the entry matches its own manifest.
    (entry,) = [m.parent for m in (tmp_path / "cache").glob(f"v*/*/*/{cache_mod.MANIFEST}")]
    report = json.loads((entry / "files" / "report.json").read_text())
    report["model"] = "a/m.py:build"
    (entry / "files" / "report.json").write_text(json.dumps(report))
    manifest = json.loads((entry / cache_mod.MANIFEST).read_text())
    manifest["files"]["report.json"] = sha256_file(entry / "files" / "report.json")
    manifest["seal"] = cache_mod._seal(manifest["key"], manifest["files"], manifest["dirs"])
    (entry / cache_mod.MANIFEST).write_text(json.dumps(manifest))

    second = run_cli("compile", spec, "-o", str(tmp_path / "b"), env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    warnings = [ln for ln in second.stderr.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and "a/m.py:build" in warnings[0] and "not trusted" in warnings[0], (
        second.stderr
    )
    rebuilt = json.loads((tmp_path / "b" / "report.json").read_text())
    assert rebuilt["model"] == spec and rebuilt["cache"]["mode"] == "miss"
    assert (tmp_path / "b" / "model.pte").read_bytes() == (tmp_path / "a" / "model.pte").read_bytes()


def _cache_cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("cache", *args, env={"ETFORGE_CACHE_DIR": str(root)})


def test_entries_without_a_manifest_are_listed_and_cleared(tmp_path: Path) -> None:
    c = BuildCache(tmp_path / "cache")
    c.store("ab" * 32, _entry(tmp_path / "src"))
    orphan = c.root / "cd" / ("cd" * 32)
    (orphan / "files").mkdir(parents=True)
    (orphan / "files" / "model.pte").write_bytes(b"z" * 50)  # a killed store, or planted
    info = _cache_cli(tmp_path / "cache", "info")
    assert info.returncode == 0 and "2 builds" in info.stdout and str(orphan) in info.stdout, info.stdout
    cleared = _cache_cli(tmp_path / "cache", "clear")
    assert cleared.returncode == 0 and "removed 2 builds" in cleared.stdout, cleared.stdout + cleared.stderr
    assert not orphan.exists() and c.entries() == []


def test_clear_removes_the_kept_yaml_parses(tmp_path: Path) -> None:
    """The Edge-dialect YAML parses compile and verify keep (``lazy_imports.cache_edge_dialect_yaml``)
    go with ``cache clear``, as the builds do."""
    from etforge.core.common.lazy_imports import EDGE_YAML_DIR

    parses = tmp_path / "cache" / EDGE_YAML_DIR
    parses.mkdir(parents=True)
    (parses / ("ef" * 32 + ".json")).write_text("{}")
    cleared = _cache_cli(tmp_path / "cache", "clear")
    assert cleared.returncode == 0, cleared.stdout + cleared.stderr
    assert not parses.exists()


@pytest.fixture
def read_only_cache(tmp_path: Path) -> Iterator[Path]:
    """A cache with two builds on a file system remounted read-only (needs root to mount)."""
    mnt = tmp_path / "ro"
    mnt.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        c = BuildCache(mnt)
        for key in ("ab" * 32, "cd" * 32):
            c.store(key, _entry(tmp_path / "src"))
        subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.parametrize("args", [("clear",), ("prune", "--max-size", "0")])
def test_a_read_only_cache_is_reported_not_claimed_removed(
    read_only_cache: Path, args: tuple[str, ...]
) -> None:
    proc = _cache_cli(read_only_cache, *args)
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "removed 0 builds" in proc.stdout
    assert len(errors) == 2 and all("cannot remove" in e and "Read-only file system" in e for e in errors)
    assert len(BuildCache(read_only_cache).entries()) == 2


def test_an_entry_holding_a_symlink_is_never_restored(tmp_path: Path) -> None:
    c = BuildCache(tmp_path / "cache")
    key = "ef" * 32
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the output")
    c.store(key, _entry(tmp_path / "src"))
    entry = c.root / key[:2] / key
    (entry / "files" / "model.pte").unlink()
    (entry / "files" / "model.pte").symlink_to(secret)  # same digest listed: re-sealed below
    manifest = json.loads((entry / cache_mod.MANIFEST).read_text())
    manifest["files"]["model.pte"] = sha256_file(secret)
    manifest["seal"] = cache_mod._seal(key, manifest["files"], manifest["dirs"])
    (entry / cache_mod.MANIFEST).write_text(json.dumps(manifest))
    dest = tmp_path / "dest"
    dest.mkdir()
    assert not c.restore(key, dest) and "symbolic link" in c.why and list(dest.iterdir()) == []
