"""No code runs from data: a pickle planted in any file etforge reads is refused, never executed.

``torch.export.load`` retries a failed ``weights_only=True`` load with ``weights_only=False``
and unpickles "pickled" weights and constants with plain pickle; each planted file below
holds a ``__reduce__`` that would create a marker file. The marker must never appear and the
error must name the file.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from etforge.core.cache import store as cache_mod
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


class _Evil:
    """Unpickling this opens (creates) the marker file: code execution, made visible."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.marker, "w"))


def _evil_bytes(marker: Path) -> bytes:
    buf = io.BytesIO()
    torch.save(((torch.zeros(1, 8),), {"x": _Evil(marker)}), buf)
    return buf.getvalue()


def _rewrite(archive: Path, edit: Callable[[str, bytes], bytes]) -> None:
    with zipfile.ZipFile(archive) as z:
        items = [(info, z.read(info.filename)) for info in z.infolist()]
    with zipfile.ZipFile(archive, "w") as z:
        for info, data in items:
            z.writestr(info, edit(info.filename, data))


def plant_sample_inputs(archive: Path, marker: Path) -> None:
    """The example inputs (``<name>/data/sample_inputs/model.pt``) become a pickle."""
    _rewrite(archive, lambda n, d: _evil_bytes(marker) if n.endswith("sample_inputs/model.pt") else d)


def plant_weight(archive: Path, marker: Path) -> None:
    """A weight is marked ``use_pickle`` (torch then reads it with ``weights_only=False``)."""

    def edit(name: str, data: bytes) -> bytes:
        if name.endswith("weights/model_weights_config.json"):
            config = json.loads(data)
            first = next(iter(config["config"].values()))
            first["use_pickle"] = True
            return json.dumps(config).encode()
        return data

    _rewrite(archive, edit)
    with zipfile.ZipFile(archive) as z:
        config_name = next(n for n in z.namelist() if n.endswith("weights/model_weights_config.json"))
        target = next(iter(json.loads(z.read(config_name))["config"].values()))["path_name"]
    _rewrite(archive, lambda n, d: _evil_bytes(marker) if n.endswith(f"weights/{target}") else d)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    """One compile (cache on, in a private cache): its OUT, the model file and the env."""
    tmp = tmp_path_factory.mktemp("nopickle")
    (tmp / "net.py").write_text(MODEL)
    env = {"ETFORGE_NO_CACHE": "0", "ETFORGE_CACHE_DIR": str(tmp / "cache")}
    proc = run_cli("compile", f"{tmp / 'net.py'}:build", "-o", str(tmp / "out"), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return tmp / "out", tmp / "net.py", env


def _rehash(out: Path) -> None:
    """Re-record the side files' hashes in report.json, as whoever planted a file would: the
    hash chain then passes and only the loader stands between the pickle and the process."""
    from etforge.runtime.verification.artifact import record_hashes

    report = json.loads((out / "report.json").read_text())
    record_hashes(out, report)
    (out / "report.json").write_text(json.dumps(report, indent=2))


def _copy(out: Path, dest: Path) -> Path:
    import shutil

    shutil.copytree(out, dest)
    return dest


def test_verify_never_unpickles_an_output_directory(
    built: tuple[Path, Path, dict[str, str]], tmp_path: Path
) -> None:
    out = _copy(built[0], tmp_path / "out")
    marker = tmp_path / "EXECUTED"
    plant_sample_inputs(out / "float.pt2", marker)
    _rehash(out)
    proc = run_cli("verify", str(out))
    assert not marker.exists(), "a pickle in the output directory ran"
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and f"{out / 'float.pt2'}: refused" in lines[0], proc.stderr


@pytest.mark.parametrize(
    ("member", "plant"),
    [
        ("float.pt2", plant_sample_inputs),
        ("quantized.pt2", plant_sample_inputs),
        ("quantized.pt2", plant_weight),
    ],
)
def test_every_program_file_is_loaded_tensors_only(
    built: tuple[Path, Path, dict[str, str]], tmp_path: Path, member: str, plant: Callable[[Path, Path], None]
) -> None:
    """What verify (and compile, for a .pt2 model) loads programs with: planted pickles in
    the example inputs or a weight torch would unpickle are refused, naming the file."""
    import etforge.core.build.pipeline  # noqa: F401  (registers the quantized ops a quantized.pt2 names)
    from etforge.core.common.errors import EtforgeError
    from etforge.core.front.load import load_program

    path = tmp_path / member
    path.write_bytes((built[0] / member).read_bytes())
    load_program(path)  # intact: loads
    marker = tmp_path / "EXECUTED"
    plant(path, marker)
    with pytest.raises(EtforgeError, match="refused") as err:
        load_program(path)
    assert not marker.exists(), "a planted pickle ran"
    assert str(err.value).startswith(f"{path}: refused") and "\n" not in str(err.value)
    assert torch.load is not None and torch.load.__module__ == "torch.serialization"  # restored


def test_compile_never_unpickles_a_pt2_model(tmp_path: Path) -> None:
    evil = tmp_path / "evil.pt2"
    net = torch.nn.Linear(8, 4)
    torch.export.save(torch.export.export(net, (torch.randn(1, 8),)), evil)
    marker = tmp_path / "EXECUTED"
    plant_sample_inputs(evil, marker)
    proc = run_cli("compile", str(evil), "-o", str(tmp_path / "out"), env={"ETFORGE_NO_CACHE": "1"})
    assert not marker.exists(), "a pickle in the model file ran"
    assert proc.returncode == 1
    assert f"error: {evil}: refused" in proc.stderr and not (tmp_path / "out").exists(), proc.stderr


def test_a_planted_cache_entry_never_runs_code(
    built: tuple[Path, Path, dict[str, str]], tmp_path: Path
) -> None:
    """Whoever can write the cache can choose the bytes a compile restores (docs/batch.md:
    trust), but never run code: the restored programs are loaded tensors-only too."""
    out, model, env = built
    root = Path(env["ETFORGE_CACHE_DIR"]) / f"v{cache_mod.CACHE_FORMAT}"
    (entry,) = [m.parent for m in root.glob(f"*/*/{cache_mod.MANIFEST}")]
    marker = tmp_path / "EXECUTED"
    plant_sample_inputs(entry / "files" / "float.pt2", marker)
    _rehash(entry / "files")
    manifest = json.loads((entry / cache_mod.MANIFEST).read_text())  # re-sealed, as a planter would
    for name in ("float.pt2", "report.json"):
        manifest["files"][name] = sha256_file(entry / "files" / name)
    manifest["seal"] = cache_mod._seal(manifest["key"], manifest["files"], manifest["dirs"])
    (entry / cache_mod.MANIFEST).write_text(json.dumps(manifest))
    again = tmp_path / "again"
    proc = run_cli("compile", f"{model}:build", "-o", str(again), env=env)
    assert proc.returncode == 0 and "from the build cache" in proc.stdout, proc.stdout + proc.stderr
    proc = run_cli("verify", str(again))
    assert not marker.exists(), "a pickle planted in the cache ran"
    assert proc.returncode != 0 and f"{again / 'float.pt2'}: refused" in proc.stderr, proc.stderr
