"""Many models at once: a manifest compiled on the local process pool and on a local Ray instance."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from batch_models import FACTORIES, PROBE

from etforge.core.batch.run import load_manifest
from etforge.core.common.errors import EtforgeError

from support import REPO, run_cli

MODELS = REPO / "tests" / "batch_models.py"


def _manifest(tmp_path: Path, models: list[str], suffix: str = ".json") -> Path:
    path = tmp_path / f"manifest{suffix}"
    if suffix == ".toml":
        body = "targets = ['imxrt700']\nmodels = [" + ", ".join(f"'{m}'" for m in models) + "]\n"
        path.write_text(body)
    else:
        path.write_text(json.dumps({"models": models, "targets": ["imxrt700"]}))
    return path


def _check_outputs(out: Path, names: list[str]) -> None:
    for name in names:
        job = out / f"batch_models_{name}" / "imxrt700"
        report = json.loads((job / "report.json").read_text())
        assert report["target"] == "imxrt700" and (job / "model.pte").stat().st_size > 0


def _cache_mode(out: Path, name: str) -> str:
    report = out / f"batch_models_{name}" / "imxrt700" / "report.json"
    return json.loads(report.read_text())["cache"]["mode"]


@pytest.fixture(scope="module")
def pool_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    """The twelve models and one that fails, on the local pool, into a build cache of their own
    (empty: every job compiles; the Ray test restores its twelve from it)."""
    tmp = tmp_path_factory.mktemp("pool")
    models = [f"{MODELS}:{f}" for f in FACTORIES] + [
        str(REPO / "tests" / "models" / "user_models.py") + ":raises"
    ]
    env = {"ETFORGE_NO_CACHE": "0", "ETFORGE_CACHE_DIR": str(tmp / "cache")}
    manifest = _manifest(tmp, models, ".toml")
    proc = run_cli("compile", "--manifest", str(manifest), "-o", str(tmp / "out"), "--jobs", "2", env=env)
    return proc, tmp


def test_twelve_model_manifest_on_the_local_pool_with_one_failure(
    pool_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    proc, tmp = pool_run
    out = tmp / "out"
    assert proc.returncode == 1, proc.stdout + proc.stderr  # one job failed ...
    _check_outputs(out, FACTORIES)  # ... the other twelve were compiled
    assert all(_cache_mode(out, name) == "miss" for name in FACTORIES)  # afresh, into the cache
    assert "12 of 13 compiled" in proc.stdout
    assert "weights file missing" in proc.stdout  # the failure, named in the summary
    assert not (out / "user_models_raises" / "imxrt700" / "model.pte").exists()


def test_several_models_on_the_command_line(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_cli("compile", f"{MODELS}:mlp", f"{MODELS}:residual", "--target", "imxrt700", "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _check_outputs(out, ["mlp", "residual"])
    assert "2 of 2 compiled" in proc.stdout


def test_twelve_model_manifest_on_local_ray(
    pool_run: tuple[subprocess.CompletedProcess[str], Path], tmp_path: Path
) -> None:
    """Twelve jobs as Ray tasks on a local Ray: each ran in a Ray worker at this process's
    priority, used the caller's build cache, and its output came back byte for byte.

    The jobs restore what the pool test compiled (the compile itself is the same child
    process on either executor): what is Ray's here is the tasks, the workers' environment
    and the archives shipped back."""
    pytest.importorskip("ray")
    pool_proc, pool = pool_run
    assert "12 of 13 compiled" in pool_proc.stdout, pool_proc.stdout + pool_proc.stderr
    models = [f"{MODELS}:{f}" for f in FACTORIES]
    out, probe = tmp_path / "out", tmp_path / "probe.txt"
    env = {"ETFORGE_NO_CACHE": "0", "ETFORGE_CACHE_DIR": str(pool / "cache"), PROBE: str(probe)}
    proc = run_cli(
        "compile", "--manifest", str(_manifest(tmp_path, models)), "-o", str(out), "--ray", "local", env=env
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _check_outputs(out, FACTORIES)
    assert "12 of 12 compiled" in proc.stdout
    runs = [line.split(" ", 2) for line in probe.read_text().splitlines()]
    assert {name for name, _, _ in runs} == set(FACTORIES), runs
    # Every model was loaded by a child of a Ray worker running the task (not by a local
    # pool), at the caller's niceness: Ray's default (15 more) starves the jobs beside
    # other work.
    assert {(nice, parent) for _, nice, parent in runs} == {(str(os.nice(0)), "ray::_ray_task")}, runs
    for name in FACTORIES:
        assert _cache_mode(out, name) == "exported"  # restored from the cache handed to the workers
        job = f"batch_models_{name}/imxrt700/model.pte"
        assert (out / job).read_bytes() == (pool / "out" / job).read_bytes()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("[1, 2]", "expected a table"),
        ('{"models": ["zoo:cifarnet"], "targets": ["imxrt700"], "speed": 1}', "unknown key(s) speed"),
        ('{"models": "zoo:cifarnet", "targets": [3]}', "'targets' must be a list of strings"),
        ('{"models": [], "targets": []}', "no jobs"),
        ("{not json", "not valid json"),
        ('{"models": ["zoo:a", "zoo:a"], "targets": ["t"]}', "same output directory"),
    ],
)
def test_bad_manifests_are_named(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "m.json"
    path.write_text(body)
    with pytest.raises(EtforgeError, match="m.json") as info:
        load_manifest(path, tmp_path / "out")
    assert message in str(info.value)
