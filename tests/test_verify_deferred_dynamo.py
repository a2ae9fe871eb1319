"""verify leaves Dynamo's and Inductor's package inits unrun (runtime/verification/deferred_dynamo.py):
the verification passes on both kinds of target without Dynamo's tracer imported, and whatever
does need Dynamo later (a submodule outside the ones that import alone, another name, an export)
gets it in full, in Dynamo's own order, with the stand-ins gone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO, run_cli, run_cli_recording_modules

MODEL = str(REPO / "tests" / "models" / "user_models.py")

#: Dynamo's tracer and Inductor's compiler: what importing ``torch._dynamo`` whole brings.
TRACER = ("torch._dynamo.convert_frame", "torch._dynamo.variables", "torch._dynamo.symbolic_convert",
          "torch._inductor.standalone_compile")  # fmt: skip


@pytest.mark.parametrize("target", ["imxrt700cm", "cortex-m33"])
def test_verify_passes_without_dynamos_tracer(tmp_path: Path, target: str) -> None:
    out = tmp_path / "out"
    proc = run_cli("compile", f"{MODEL}:small", "--target", target, "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc, imported = run_cli_recording_modules(tmp_path / "probe", "verify", str(out), "--samples", "2")
    assert proc.returncode == 0 and "verify passed" in proc.stdout, proc.stdout + proc.stderr
    assert "unreadable" not in proc.stdout, proc.stdout  # the saved program was read, not lowered again
    assert not [m for m in TRACER if m in imported], [m for m in TRACER if m in imported]
    assert imported.get("torch._dynamo") == "_Package" and imported.get("torch._inductor") == "_Package"


IN_FULL = r"""
import sys, torch
from etforge.runtime.verification import deferred_dynamo

assert deferred_dynamo.defer() and deferred_dynamo.deferred()
calls = []
def probe(x):
    calls.append(x)
    return x + 1
# torch._compile's use: the call as it is while Dynamo has not started
disabled = torch._dynamo.disable(probe, wrapping=False)
assert disabled(1) == 2 and "torch._dynamo.eval_frame" not in sys.modules
from torch._dynamo.guards import Guard  # ExecuTorch's tracer's import: torch's own Guard
import torch._guards
assert Guard is torch._guards.Guard and deferred_dynamo.deferred()
how = sys.argv[1]
if how == "submodule":  # imported alone it would find Dynamo half there (a circular import)
    import torch._dynamo.convert_frame as convert_frame
    assert convert_frame is sys.modules["torch._dynamo.convert_frame"]
elif how == "name":
    torch._dynamo.reset()
else:  # an export: Dynamo runs
    class M(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2
    ep = torch.export.export(M(), (torch.randn(2, 3),))
    x = torch.randn(2, 3)
    assert torch.equal(ep.module()(x), M()(x))
assert not deferred_dynamo.deferred() and type(sys.modules["torch._dynamo"]) is type(sys)
assert type(sys.modules["torch._inductor"]) is type(sys)
assert type(sys.modules["torch._dynamo.guards"]) is type(sys)  # the real one, stand-in gone
assert torch._dynamo.guards is sys.modules["torch._dynamo.guards"]
assert torch._dynamo.disable is not deferred_dynamo._disable
assert "torch._dynamo.variables" in sys.modules and "torch._inductor.standalone_compile" in sys.modules
assert disabled(2) == 3 and calls == [1, 2]  # now through Dynamo's own wrapper
print("ok")
"""


@pytest.mark.parametrize("how", ["submodule", "name", "export"])
def test_what_needs_dynamo_gets_it_in_full(how: str) -> None:
    proc = subprocess.run([sys.executable, "-c", IN_FULL, how], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), (
        proc.stdout[-2000:] + proc.stderr[-4000:]
    )
