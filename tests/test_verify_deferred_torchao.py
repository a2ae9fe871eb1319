"""verify defers torchao's package inits (runtime/verification/deferred_imports.py): ExecuTorch
still finds the ops it reads, the verification passes with torchao's ``__init__`` unrun, and a
program with an op only that ``__init__`` registers still loads (the init run in full, the
load tried again)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO, run_cli

MODEL = str(REPO / "tests" / "models" / "user_models.py")

#: Loaded first by the interpreter (PYTHONPATH): writes whether torchao's __init__ ran.
PROBE = """
import atexit, os, sys

def _report() -> None:
    where = os.environ.get("ETFORGE_TEST_TORCHAO_OUT")
    if where:
        with open(where, "w") as f:
            f.write(",".join(sorted(m for m in sys.modules if m.startswith("torchao"))))

atexit.register(_report)
"""


def test_verify_passes_with_torchaos_init_unrun(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_cli("compile", f"{MODEL}:small", "--target", "imxrt700cm", "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "sitecustomize.py").write_text(PROBE)
    modules = tmp_path / "modules"
    proc = run_cli(
        "verify", str(out), "--samples", "2",
        env={"ETFORGE_TEST_TORCHAO_OUT": str(modules)}, pythonpath=probe, subprocess_only=True,
    )  # fmt: skip
    assert proc.returncode == 0 and "verify passed" in proc.stdout, proc.stdout + proc.stderr
    imported = set(modules.read_text().split(","))
    assert "torchao.quantization.quant_primitives" in imported  # the ops ExecuTorch reads
    # the optimizers, the quantization API: what torchao's and torchao.quantization's __init__ import
    assert not {"torchao.optim", "torchao.quantization.quant_api", "torchao.dtypes"} & imported, imported


EXPORT = """
import sys, torch, torchao

class M(torch.nn.Module):
    def forward(self, a, b):
        return torch.ops.torchao.swizzle_mm(a, b, False, False)  # registered by torchao's __init__ alone

torch.export.save(torch.export.export(M(), (torch.randn(4, 8), torch.randn(8, 4))), sys.argv[1])
"""

LOAD = """
import sys
from etforge.core.front import load
from etforge.runtime.verification import deferred_imports

assert deferred_imports.defer() == ["torchao", "torchao.quantization"]
try:
    load.load_program(sys.argv[1])
except RuntimeError:
    pass
else:
    raise AssertionError("loaded without the op's registration: the case proves nothing")
ep = deferred_imports.load_program(sys.argv[1])
assert "swizzle_mm" in str(ep.graph) and type(sys.modules["torchao"]).__name__ == "module"
print("ok")
"""


def test_a_program_with_an_op_only_torchaos_init_registers_loads(tmp_path: Path) -> None:
    pytest.importorskip("torchao")
    pt2 = tmp_path / "swizzle.pt2"
    for script in (EXPORT, LOAD):
        proc = subprocess.run(
            [sys.executable, "-c", script, str(pt2)], capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok"), proc.stdout
