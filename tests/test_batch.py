"""Many models at once: a manifest compiled on the local process pool and on a local Ray instance."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from batch_models import FACTORIES

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


def test_twelve_model_manifest_on_the_local_pool_with_one_failure(tmp_path: Path) -> None:
    models = [f"{MODELS}:{f}" for f in FACTORIES] + [
        str(REPO / "tests" / "models" / "user_models.py") + ":raises"
    ]
    out = tmp_path / "out"
    proc = run_cli(
        "compile", "--manifest", str(_manifest(tmp_path, models, ".toml")), "-o", str(out), "--jobs", "2"
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr  # one job failed ...
    _check_outputs(out, FACTORIES)  # ... the other twelve were compiled
    assert "12 of 13 compiled" in proc.stdout
    assert "weights file missing" in proc.stdout  # the failure, named in the summary
    assert not (out / "user_models_raises" / "imxrt700" / "model.pte").exists()


def test_several_models_on_the_command_line(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_cli("compile", f"{MODELS}:mlp", f"{MODELS}:residual", "--target", "imxrt700", "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _check_outputs(out, ["mlp", "residual"])
    assert "2 of 2 compiled" in proc.stdout


def test_twelve_model_manifest_on_local_ray(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    models = [f"{MODELS}:{f}" for f in FACTORIES]
    out = tmp_path / "out"
    proc = run_cli(
        "compile", "--manifest", str(_manifest(tmp_path, models)), "-o", str(out), "--ray", "local"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _check_outputs(out, FACTORIES)
    assert "12 of 12 compiled" in proc.stdout


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
