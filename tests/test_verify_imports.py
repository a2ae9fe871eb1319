"""What ``etforge verify`` imports (issue 47): the package inits a host run does without stay
unrun (core/common/lazy_imports.py ``HOST_DEFERRED_INITS``, ``CpuBackend.host_deferred_inits``),
while the op library a program names is registered and the verification passes.

sympy and torchao are imported by what verify runs (``torch.export.load``; the Edge-dialect
verifier reading ``lowered_edge.exir``): not asserted here; Dynamo's and Inductor's package inits
stay unrun (tests/test_verify_deferred_dynamo.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from shared_outputs import compile_once

from support import REPO, run_cli_recording_modules

MODEL = str(REPO / "tests" / "models" / "user_models.py")

#: Modules of the Arm backend's MX-format extension and TOSA dialect, and of the Cortex-M passes:
#: verify runs none of them (before, the Arm ``__init__`` and the passes package imported them).
NOT_RUN = (
    "executorch.backends.arm.ao_ext",
    "executorch.backends.arm.tosa.dialect",
    "executorch.backends.cortex_m.passes.aten_to_cortex_m_pass",
    "executorch.backends.cortex_m.passes.cortex_m_pass_manager",
)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    outs = {}
    for target in ("imxrt700cm", "cortex-m33"):
        out = tmp_path_factory.mktemp(target)
        proc = compile_once(f"{MODEL}:small", "--target", target, out=out)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        outs[target] = out
    return outs


@pytest.mark.parametrize("target", ["imxrt700cm", "cortex-m33"])
def test_verify_leaves_unused_package_inits_unrun(
    outputs: dict[str, Path], target: str, tmp_path: Path
) -> None:
    proc, imported = run_cli_recording_modules(tmp_path, "verify", str(outputs[target]), "--samples", "2")
    assert proc.returncode == 0 and "verify passed" in proc.stdout, proc.stdout + proc.stderr
    assert "unreadable" not in proc.stdout, proc.stdout  # the saved program was read, not lowered again
    # the program's CPU ops are cortex_m:: ones: their library was registered, alone
    assert "executorch.backends.cortex_m.ops.operators" in imported
    assert not [m for m in NOT_RUN if m in imported], [m for m in NOT_RUN if m in imported]


SUBMODULES = r"""
import sys
from etforge.core.common.lazy_imports import defer_package_inits

sys.path.insert(0, sys.argv[1])
assert defer_package_inits(("pkg", "executorch.backends.cortex_m.passes")) == ["pkg", "executorch.backends.cortex_m.passes"]
pkg, passes = sys.modules["pkg"], sys.modules["executorch.backends.cortex_m.passes"]
# a submodule read from the package imports that module alone: the __init__ stays unrun
from executorch.backends.cortex_m.passes import passes_utils
from pkg import other
assert passes_utils is sys.modules["executorch.backends.cortex_m.passes.passes_utils"] and other.VALUE == 2
assert "executorch.backends.cortex_m.passes.aten_to_cortex_m_pass" not in sys.modules
assert type(passes).__name__ == type(pkg).__name__ == "_DeferredInit" and not hasattr(sys, "pkg_init_ran")
# a name the __init__ binds to something else than its submodule of that name: what the __init__ binds
from pkg import sub
assert sub() == 1 and type(pkg).__name__ == "_DeferredInit"
# a name the __init__ defines runs it, once
assert pkg.FLAG and sys.pkg_init_ran == 1 and type(pkg).__name__ == "module"
# a name the __init__ imports from a module: read from that module, the __init__ still unrun
assert passes.CortexMPassManager.pass_list and type(passes).__name__ == "_DeferredInit"
print("ok")
"""


def test_a_deferred_packages_submodule_imports_alone(tmp_path: Path) -> None:
    import subprocess
    import sys

    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        "import sys\nfrom .sub import sub\nsys.pkg_init_ran = getattr(sys, 'pkg_init_ran', 0) + 1\nFLAG = True\n"
    )
    (pkg / "sub.py").write_text("def sub():\n    return 1\n")
    (pkg / "other.py").write_text("VALUE = 2\n")
    proc = subprocess.run(
        [sys.executable, "-c", SUBMODULES, str(tmp_path)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


EDGE_YAML = r"""
import sys
from pathlib import Path

from etforge.core.common.lazy_imports import EDGE_OPS, cache_edge_dialect_yaml

cache, hit = Path(sys.argv[1]), sys.argv[2] == "hit"
if hit:  # the cached parse answers: ruamel parses nothing
    import ruamel.yaml.main

    def refuse(self, stream):
        raise AssertionError("ruamel parsed the Edge YAML again")

    ruamel.yaml.main.YAML.load = refuse
assert cache_edge_dialect_yaml(cache)
import importlib

edge = importlib.import_module(EDGE_OPS)
import ruamel.yaml

assert ruamel.yaml.YAML is ruamel.yaml.main.YAML  # ruamel's own again after the one load
print(repr(edge._edge_dialect_info))
"""


def test_the_edge_dialect_yaml_parse_comes_from_the_cache_unchanged(tmp_path: Path) -> None:
    """The Edge dialect's op rules as ExecuTorch parses them, then the same from the cache."""
    import subprocess
    import sys

    def run(mode: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-c", EDGE_YAML, str(tmp_path), mode],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    plain = subprocess.run(
        [sys.executable, "-c", f"import importlib; print(repr(importlib.import_module({'executorch.exir.dialects.edge._ops'!r})._edge_dialect_info))"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert plain.returncode == 0, plain.stderr[-3000:]
    first = run("miss")
    assert len(list((tmp_path / "edge-dialect").glob("*.json"))) == 1
    assert first == plain.stdout == run("hit") and "'inherits'" in first
