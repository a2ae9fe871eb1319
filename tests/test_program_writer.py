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
