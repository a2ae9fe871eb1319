"""``--no-cache`` means no cache: for one model, several, a manifest and Ray workers (issue 48).

The cache is filled first, so a job that ignored the flag would answer from it; each run with
``--no-cache`` must compile afresh (``cache: miss``, the cache off) and leave the cache exactly
as it was: nothing restored (a restore marks its entry used), nothing stored.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support import REPO, run_cli

MODELS = REPO / "tests" / "batch_models.py"
SPECS = [f"{MODELS}:mlp", f"{MODELS}:residual"]


def _snapshot(cache: Path) -> dict[str, int]:
    return {str(p.relative_to(cache)): p.stat().st_mtime_ns for p in sorted((cache / "v1").rglob("*"))}


def _modes(out: Path) -> list[dict[str, str]]:
    return [json.loads(p.read_text())["cache"] for p in sorted(out.rglob("report.json"))]


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    tmp = tmp_path_factory.mktemp("nocache")
    env = {"ETFORGE_NO_CACHE": "0", "ETFORGE_CACHE_DIR": str(tmp / "cache")}
    # Filled in this process, one compile per model (a batch would start a process per model
    # and one for itself, issue 47); the batch below proves its jobs' processes find the entries.
    for i, spec in enumerate(SPECS):
        proc = run_cli("compile", spec, "--target", "imxrt700", "-o", str(tmp / "fill" / str(i)), env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert _modes(tmp / "fill" / str(i))[0]["mode"] == "miss"
    again = run_cli("compile", *SPECS, "--target", "imxrt700", "-o", str(tmp / "again"), env=env)
    assert again.returncode == 0 and {m["mode"] for m in _modes(tmp / "again")} == {"exported"}
    manifest = tmp / "m.json"
    manifest.write_text(json.dumps({"models": SPECS, "targets": ["imxrt700"]}))
    return tmp, env


@pytest.mark.parametrize(
    "how",
    ["one model", "several models", "manifest", "ray workers"],
)
def test_no_cache_compiles_afresh_and_leaves_the_cache_alone(
    filled: tuple[Path, dict[str, str]], how: str
) -> None:
    tmp, env = filled
    if how == "ray workers":
        pytest.importorskip("ray")
    out = tmp / how.replace(" ", "_")
    args = {
        "one model": [SPECS[0], "--target", "imxrt700"],
        "several models": [*SPECS, "--target", "imxrt700", "--jobs", "2"],
        "manifest": ["--manifest", str(tmp / "m.json"), "--jobs", "2"],
        "ray workers": ["--manifest", str(tmp / "m.json"), "--ray", "local"],
    }[how]
    before = _snapshot(tmp / "cache")
    proc = run_cli("compile", *args, "-o", str(out), "--no-cache", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    modes = _modes(out)
    assert len(modes) == (1 if how == "one model" else 2)
    assert all(m == {"mode": "miss", "reason": "the build cache is off"} for m in modes), modes
    assert _snapshot(tmp / "cache") == before  # nothing restored, nothing stored
