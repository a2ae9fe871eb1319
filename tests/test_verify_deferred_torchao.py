"""verify defers torchao's package inits and Inductor's decomposition table
(runtime/verification/deferred_imports.py): ExecuTorch still finds the ops it reads, the
verification passes with torchao's ``__init__`` unrun and the table unbuilt, a read of the table
finds torchao's decompositions in it, and a program with an op only that ``__init__`` registers
still loads (the init run in full, the load tried again). What verify's imports allocated is
frozen as they end (cli/verify.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from shared_outputs import compile_once

from support import REPO, run_cli_recording_modules

MODEL = str(REPO / "tests" / "models" / "user_models.py")


def test_verify_passes_with_torchaos_init_unrun(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = compile_once(f"{MODEL}:small", "--target", "imxrt700cm", out=out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc, imported = run_cli_recording_modules(tmp_path / "probe", "verify", str(out), "--samples", "2")
    assert proc.returncode == 0 and "verify passed" in proc.stdout, proc.stdout + proc.stderr
    assert "torchao.quantization.quant_primitives" in imported  # the ops ExecuTorch reads
    # the optimizers, the quantization API: what torchao's and torchao.quantization's __init__ import
    ran = {"torchao.optim", "torchao.quantization.quant_api", "torchao.dtypes"} & imported.keys()
    assert not ran, ran
    # Inductor's decomposition table never built: torchao's registrations kept by the stand-in
    held = imported.get("torch._inductor.decomposition")
    assert held == "_Decompositions", held


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
name = sys.argv[1].rsplit("/", 1)[-1]
assert [n.split(":")[0] for n in deferred_imports.take_reload_notes()] == [name]  # told (verify's notes)
assert deferred_imports.take_reload_notes() == []  # once
print("ok")
"""


TABLE = """
import sys
import torch

if sys.argv[1] == "deferred":
    from etforge.runtime.verification import deferred_imports

    deferred_imports.defer()
    assert type(sys.modules["torch._inductor.decomposition"]).__name__ == "_Decompositions"
else:  # as without verify's deferral: torchao's ops registered on the real module
    import torchao.quantization.quant_primitives  # noqa: F401
from torch._inductor.decomposition import decompositions  # a read: the real module

assert type(sys.modules["torch._inductor.decomposition"]).__name__ == "module"
assert torch._inductor.decomposition is sys.modules["torch._inductor.decomposition"]
for key in sorted(decompositions, key=str):
    fn = decompositions[key]
    print(key, getattr(fn, "__module__", ""), getattr(fn, "__qualname__", type(fn).__name__))
"""


def test_inductors_decomposition_table_read_after_the_deferral_is_the_same(tmp_path: Path) -> None:
    """Inductor's decomposition table, read after the stand-in held it while torchao registered
    its ops, is the table built without the deferral: the same ops, torchao's own functions."""
    pytest.importorskip("torchao")

    def table(mode: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-c", TABLE, mode], capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return proc.stdout

    deferred = table("deferred")
    assert (
        "torchao.quantize_affine.default torchao.quantization.quant_primitives _quantize_affine" in deferred
    )
    assert deferred == table("plain")


def test_a_program_with_an_op_only_torchaos_init_registers_loads(tmp_path: Path) -> None:
    pytest.importorskip("torchao")
    pt2 = tmp_path / "swizzle.pt2"
    for script in (EXPORT, LOAD):
        proc = subprocess.run(
            [sys.executable, "-c", script, str(pt2)], capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ok"), proc.stdout


COLLECTOR = """
import gc, sys
import etforge.runtime.verification.verify as run
from etforge.cli import main

seen = {}
real = run.verify

def verify(*args, **kwargs):  # the host verification's start: the imports are done
    seen["frozen"], seen["collecting"] = gc.get_freeze_count(), gc.isenabled()
    return real(*args, **kwargs)

run.verify = verify
main(["verify", sys.argv[1], "--samples", "2"], standalone_mode=False)
# what verify's imports allocated was frozen as they ended, the collector back on for the run
assert seen["frozen"] > 100_000 and seen["collecting"], seen
assert gc.isenabled()
print("ok")
"""


def test_verify_freezes_what_its_imports_allocated(tmp_path: Path) -> None:
    """The objects verify's imports made (torchao's ops, Dynamo, Inductor, ExecuTorch) live to
    the end: frozen as the imports end, the young collections of the run no longer scan them."""
    out = tmp_path / "out"
    proc = compile_once(f"{MODEL}:small", "--target", "cortex-m33", out=out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = subprocess.run(
        [sys.executable, "-c", COLLECTOR, str(out)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), (
        proc.stdout[-2000:] + proc.stderr[-3000:]
    )
