"""float.pt2 / quantized.pt2 written by a forked child while the compile goes on."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from etforge.core.common.errors import EtforgeError
from etforge.core.serialize.program_writer import ProgramWriter

NAMES = ("float.pt2", "quantized.pt2")


def _program(width: int) -> torch.export.ExportedProgram:
    model = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.ReLU()).eval()
    return torch.export.export(model, (torch.randn(2, 4),), strict=False)


def _ops(ep: torch.export.ExportedProgram) -> list[str]:
    return [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]


def test_the_child_writes_programs_that_load_back(tmp_path: Path) -> None:
    a, b = _program(3), _program(5)
    with ProgramWriter(tmp_path, NAMES) as writer:
        writer.start(a, b)
        writer.finish()
    for name, ep in zip(NAMES, (a, b), strict=True):
        loaded = torch.export.load(str(tmp_path / name))
        assert _ops(loaded) == _ops(ep)
        x = torch.randn(2, 4)
        assert torch.equal(loaded.module()(x), ep.module()(x))


def test_a_rebuild_replaces_the_first_programs(tmp_path: Path) -> None:
    with ProgramWriter(tmp_path, NAMES) as writer:
        writer.start(_program(3), _program(3))
        writer.start(_program(7), None)  # the kernel check rebuilt from a new float program
        writer.finish()
    assert torch.export.load(str(tmp_path / NAMES[0])).module()(torch.randn(2, 4)).shape == (2, 7)
    assert not (tmp_path / NAMES[1]).exists()


def test_a_failed_write_fails_the_compile_naming_the_files(tmp_path: Path) -> None:
    missing = tmp_path / "gone"  # the directory does not exist: the child cannot write
    writer = ProgramWriter(missing, NAMES)
    writer.start(_program(3), _program(3))
    with pytest.raises(EtforgeError, match=r"could not write float\.pt2 and quantized\.pt2 into .*gone"):
        writer.finish()


def test_leaving_on_an_error_kills_the_child_and_removes_its_files(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), ProgramWriter(tmp_path, NAMES) as writer:
        writer.start(_program(3), _program(3))
        raise RuntimeError("lowering failed")
    assert not any(tmp_path.iterdir())


def test_the_float_program_starts_before_quantization_and_is_not_restarted(tmp_path: Path) -> None:
    a, b = _program(3), _program(5)
    with ProgramWriter(tmp_path, NAMES) as writer:
        writer.start(a, None)  # the float program is final before quantization
        (first,) = [pid for pid, _ in writer._jobs.values()]
        writer.start(a, b)  # quantization done: the same float program, a new quantized one
        assert writer._jobs[NAMES[0]][0] == first and len(writer._jobs) == 2
        writer.finish()
    for name, ep in zip(NAMES, (a, b), strict=True):
        x = torch.randn(2, 4)
        assert torch.equal(torch.export.load(str(tmp_path / name)).module()(x), ep.module()(x))


def test_the_lowered_program_is_written_by_a_child_and_loads_back(tmp_path: Path) -> None:
    """The lowered Edge program (lowered_edge.exir): the child's bytes are the in-process ones,
    and the program loads back computing the same (a failed write is named like the others)."""
    from executorch.exir import to_edge

    from etforge.core.serialize.lowered_program import load_lowered, to_bytes

    edge = to_edge(_program(3)).exported_program()
    with ProgramWriter(tmp_path, NAMES, lowered="lowered_edge.exir") as writer:
        writer.start_lowered(edge)
        assert len(writer._jobs) == 1
        writer.finish()
    assert (tmp_path / "lowered_edge.exir").read_bytes() == to_bytes(edge)
    loaded = load_lowered(tmp_path / "lowered_edge.exir")
    x = torch.randn(2, 4)
    assert _ops(loaded) == _ops(edge) and torch.equal(loaded.module()(x), edge.module()(x))
    writer = ProgramWriter(tmp_path / "gone", NAMES, lowered="lowered_edge.exir")
    writer.start_lowered(edge)
    with pytest.raises(EtforgeError, match=r"could not write lowered_edge\.exir into .*gone"):
        writer.finish()


_STAND_IN_SCRIPT = """
import sys
from pathlib import Path

import torch

import etforge.core.serialize.program_writer as pw
from etforge.core.serialize.inductor_stand_in import stand_in

out = Path(sys.argv[1])
model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten()).eval()
ep = torch.export.export(model, (torch.randn(1, 3, 6, 6),), strict=False)
real_save = pw.save_program


def save(program, path):  # what the child saw of torch._inductor.ir, then the real save
    (path.parent / "seen").write_text(type(sys.modules.get("torch._inductor.ir")).__name__)
    real_save(program, path)


pw.save_program = save
with pw.ProgramWriter(out, ("float.pt2", "quantized.pt2")) as writer:
    writer.start(ep, None)
    writer.finish()
assert "torch._inductor.ir" not in sys.modules  # the parent never imported it
with stand_in():
    ir = sys.modules["torch._inductor.ir"]
    assert not isinstance(ep, (ir.Buffer, ir.ReinterpretView)) and not isinstance(1, ir.TorchBindObject)
    try:
        ir.Buffer()
    except TypeError:
        pass
    else:
        raise AssertionError("a stand-in class was instantiated")
assert "torch._inductor.ir" not in sys.modules  # gone after the block
import torch._inductor.ir as real

with stand_in():
    assert sys.modules["torch._inductor.ir"] is real  # an imported module is kept
real_save(ep, out / "inductor.pt2")  # written with the real module
"""


def test_a_child_writes_without_importing_inductor_and_the_same_bytes(tmp_path: Path) -> None:
    """The serializers' ``import torch._inductor.ir`` is answered by the stand-in in a writer child
    (a quarter of its CPU on resnet18), and the file is byte for byte what the real module gives.
    A fresh process: this one may have imported Inductor already."""
    import subprocess
    import sys

    script = tmp_path / "stand_in.py"
    script.write_text(_STAND_IN_SCRIPT)
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "seen").read_text() == "_StandIn"
    assert (tmp_path / "float.pt2").read_bytes() == (tmp_path / "inductor.pt2").read_bytes()
