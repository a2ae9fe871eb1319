"""The package builds as a wheel whose metadata registers the built-ins, installs with plain
``pip install``, and a third-party plugin package is discovered in a fresh venv."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from support import REPO

BUILTIN_ENTRY_POINTS = {
    "ops_conv", "ops_linear", "ops_elementwise", "ops_activation", "ops_pool", "ops_shape",
    "ops_softmax", "ops_reduce", "ops_resize", "targets_neutron", "targets_cortex_m", "targets_litert", "cpu_portable",
    "npu_eiq_neutron_sdk", "rewrites_activation", "rewrites_split", "rewrites_shuffle",
    "rewrites_normalization", "rewrites_arithmetic", "rewrites_grouped_conv", "rewrites_constants", "rewrites_attention",
}  # fmt: skip


def _source_copy(src: Path, dest: Path) -> Path:
    """A copy of a source tree to build from: pip's build writes ``*.egg-info/`` and ``build/``
    into the tree it builds, and the checkout is shared with the tests running beside this one
    (a compile reading etforge's entry points while a build rewrites them). Left out: at the top,
    environments, VCS, caches and earlier build outputs; everywhere, bytecode caches."""
    top = {".git", ".pytest_cache", ".hypothesis", ".ruff_cache", "build", "out"}

    def ignore(directory: str, names: list[str]) -> set[str]:
        skip = {n for n in names if n == "__pycache__"}
        if Path(directory) == src:
            skip |= {n for n in names if n in top or n.startswith(".venv") or n.endswith(".egg-info")}
        return skip

    shutil.copytree(src, dest, ignore=ignore)
    return dest


def _pip(python: str, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([python, "-m", "pip", *args], capture_output=True, text=True, cwd=cwd, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    src = _source_copy(REPO, tmp_path_factory.mktemp("src") / "etforge")
    _pip(sys.executable, "wheel", "--no-deps", "--no-build-isolation", "-w", str(out), str(src))
    (path,) = out.glob("etforge-*.whl")
    return path


def test_wheel_metadata_registers_builtin_plugins(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (eps_name,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        eps = zf.read(eps_name).decode()
    section = eps.split("[etforge]")[1].split("[")[0]
    registered = {line.split("=")[0].strip() for line in section.splitlines() if "=" in line}
    assert registered == BUILTIN_ENTRY_POINTS
    assert "etforge = etforge.cli:run" in eps
    assert "etforge/codegen/templates/" in "".join(names) or not list(
        (REPO / "codegen" / "templates").glob("*.j2")
    )
    assert not any(n.startswith(("etforge/tests/", "tests/")) for n in names)
    # find_package(etforge CONFIG): the CMake package ships in the wheel (`etforge cmake-dir`)
    assert {"etforge/cmake/etforgeConfig.cmake", "etforge/cmake/etforge.cmake"} <= set(names)


def test_plain_install_imports_from_elsewhere(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    _pip(sys.executable, "install", "--no-deps", "--target", str(target), str(wheel))
    code = (
        "import etforge, etforge.core.contracts.hookspecs, etforge.plugins.ops.conv; print(etforge.__file__)"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith(str(target))


def test_third_party_plugin_in_a_fresh_venv(tmp_path: Path) -> None:
    """pip-install tests/plugin_example into a new venv; etforge finds it and its own test passes."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    # The venv sees this environment's packages (torch, executorch, etforge, pip, setuptools)
    # through a .pth hook, so nothing heavy is reinstalled; pip installs the plugin into the venv.
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    parent = sysconfig.get_paths()["purelib"]
    Path(purelib, "_parent_env.pth").write_text(f"import site; site.addsitedir({parent!r})\n")
    plugin = _source_copy(REPO / "tests" / "plugin_example", tmp_path / "plugin_example")
    _pip(python, "install", "--no-deps", "--no-build-isolation", str(plugin))
    proc = subprocess.run(
        [python, "-m", "etforge", "plugins", "--json"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    plugins = {p["name"]: p for p in json.loads(proc.stdout)["plugins"]}
    example = plugins["example"]
    assert example["distribution"] == "etforge-example-plugin" and example["version"] == "0.3.0"
    assert example["provides"]["converters"] == ["Floor"] and example["provides"]["targets"] == ["toy-npu"]
    assert plugins["example_square"]["provides"]["rewrites"] == ["SquareAsMul"]  # one file, one entry point
    assert BUILTIN_ENTRY_POINTS <= set(plugins)
    targets = subprocess.run([python, "-m", "etforge", "targets", "--json"], capture_output=True, text=True)
    assert "toy-npu" in {t["name"] for t in json.loads(targets.stdout)}
    # The plugin's own test, written with etforge.testing, passes against its installed copy.
    test = subprocess.run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(REPO / "tests" / "plugin_example" / "tests")],
        capture_output=True, text=True, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert test.returncode == 0, test.stdout + test.stderr
