"""A CPU library is one plugin, with no edit to etforge (issue 44): ``tests/cpu_library/doublelib.py``.

Installed the way a third-party plugin is (a distribution whose entry point names it), its
``doublelib::relu`` kernel reaches the compiled program through its backend's lowering, the
kernel check and codegen read its operator list, and ``etforge verify`` runs the op on the
library's own host arithmetic (``CpuBackend.host_arithmetic``). Without that arithmetic the
op has no host implementation and verify names it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from support import REPO, run_cli, write_distribution

LIBRARY = REPO / "tests" / "cpu_library"

MODEL = """
import torch


def model():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    return m, (torch.randn(1, 8),)
"""

#: The same library with its host arithmetic left out (the backend's default: none).
WITHOUT_HOST = """
from doublelib import *  # noqa: F403
from doublelib import DoubleLibBackend, hookimpl


class NoHost(DoubleLibBackend):
    def host_arithmetic(self):
        return None


@hookimpl
def etforge_cpu_backends():
    return [NoHost()]
"""


def _site(tmp_path: Path, entry: str, extra: dict[str, str] | None = None) -> Path:
    site = write_distribution(
        tmp_path / "site", "etforge-doublelib", "0.1", {"doublelib": entry}, extra or {}
    )
    for name in ("doublelib.py", "doublelib.yaml"):
        shutil.copy(LIBRARY / name, site / name)
    (tmp_path / "model.py").write_text(MODEL)
    return site


@pytest.mark.slow  # outside the fast tier: CLI subprocesses with a plugin path (issue 47)
def test_a_third_party_cpu_library_compiles_generates_and_verifies(tmp_path: Path) -> None:
    site = _site(tmp_path, "doublelib")
    out = tmp_path / "out"
    model = f"{tmp_path / 'model.py'}:model"
    proc = run_cli("compile", model, "-t", "doublelib-cpu", "--float", "-o", str(out), pythonpath=site)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["cpu_backend"] == "doublelib" and "doublelib.relu.default" in report["cpu_ops"]
    # codegen registers the library's kernel from its own operator list
    registration = (out / "codegen" / "etforge_model_kernels.cpp").read_text()
    assert "doublelib::relu.out" in registration and "doublelib::native::relu_out" in registration
    assert "doublelib::relu.out" in (out / "codegen" / "selected_operators.yaml").read_text()
    # verify runs the op on the plugin's host arithmetic, in model.pte and in the Edge program
    proc = run_cli("verify", str(out), "--samples", "4", "--json", pythonpath=site)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert json.loads(proc.stdout)["ok"] is True


@pytest.mark.slow  # outside the fast tier: CLI subprocesses with a plugin path (issue 47)
def test_without_its_host_arithmetic_verify_names_the_op(tmp_path: Path) -> None:
    site = _site(tmp_path, "doublelib_nohost", {"doublelib_nohost": WITHOUT_HOST})
    out = tmp_path / "out"
    model = f"{tmp_path / 'model.py'}:model"
    proc = run_cli("compile", model, "-t", "doublelib-cpu", "--float", "-o", str(out), pythonpath=site)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    proc = run_cli("verify", str(out), "--samples", "4", pythonpath=site)
    assert proc.returncode != 0
    assert "operator doublelib::relu: no host implementation" in proc.stderr + proc.stdout


def test_its_dim_order_rule_is_asked() -> None:
    """runtime asks every CPU backend, the plugin's too, whether the device's kernel accepts a call."""
    import importlib.util
    import sys

    from etforge.core.registry.manager import extra_plugins
    from etforge.runtime.execution.cpu_libraries import dim_order_problem
    from etforge.sdk import KernelArg

    spec = importlib.util.spec_from_file_location("doublelib", LIBRARY / "doublelib.py")
    assert spec and spec.loader
    module = sys.modules.get("doublelib") or importlib.util.module_from_spec(spec)
    if "doublelib" not in sys.modules:
        sys.modules["doublelib"] = module
        spec.loader.exec_module(module)
    nchw, nhwc = (0, 1, 2, 3), (0, 2, 3, 1)
    x, out = KernelArg("x", (1, 2, 3, 3), nhwc), KernelArg("out", (1, 2, 3, 3), nchw, True)
    with extra_plugins(module):
        assert "doublelib's relu needs one dim order" in (
            dim_order_problem("doublelib::relu", [x, out]) or ""
        )
        assert dim_order_problem("doublelib::relu", [x, KernelArg("out", (1, 2, 3, 3), nhwc, True)]) is None
    assert dim_order_problem("doublelib::relu", [x, out]) is None  # not installed: nobody's rule
