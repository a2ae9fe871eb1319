"""The host interpreter of ``model.pte``: what verify proves is about the file that is flashed.

It must compute exactly what the Edge program computes, catch a memory plan that puts two
live tensors on the same bytes, and verify/codegen must refuse a file that is empty,
truncated, tampered with or another compile's.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from etforge.codegen import generate
from etforge.core.build import output
from etforge.core.build.report import build_report
from etforge.core.build.session import CompileResult, compile_model
from etforge.core.common.errors import EtforgeError
from etforge.core.registry.manager import registry
from etforge.runtime.execution.host import run_program
from etforge.runtime.execution.pte_interpreter import PteInterpreter
from etforge.runtime.verification.verify import verify

from support import run_cli

TARGETS = ("imxrt700", "imxrt700cm", "cortex-m33")


class _Skip(nn.Module):
    """Conv blocks with a residual add: the block input stays alive across two convs."""

    def __init__(self) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv0(x))
        y = self.conv2(torch.relu(self.conv1(x)))
        return self.fc(torch.relu(y + x).mean((2, 3)))


class _Plain(nn.Module):
    """Another model, for a foreign ``model.pte``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


def _data(seed: int, count: int) -> list[tuple[torch.Tensor, ...]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(1, 3, 8, 8, generator=g),) for _ in range(count)]


Compiled = dict[str, tuple[CompileResult, Path]]


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Compiled:
    reg = registry()
    out: Compiled = {}
    jobs: list[tuple[str, nn.Module, str]] = [(t, _Skip(), t) for t in TARGETS]
    jobs.append(("plain", _Plain(), "cortex-m33"))
    for key, module, target in jobs:
        torch.manual_seed(0)
        calib = _data(1, 4)
        result = compile_model(module.eval(), calib[0], target, calibration=calib, reg=reg)
        d = tmp_path_factory.mktemp(key)
        output.write_outputs(d, result, build_report(result, reg, key))
        out[key] = (result, d)
    return out


@pytest.mark.parametrize("target", TARGETS)
def test_the_pte_computes_exactly_what_the_edge_program_computes(compiled: Compiled, target: str) -> None:
    result, d = compiled[target]
    interp = PteInterpreter((d / output.PTE).read_bytes(), str(d / output.PTE))
    kinds = {s.kind for s in interp.steps}
    assert "kernel" in kinds and ("delegate" in kinds) == (target != "cortex-m33")
    for (x,) in _data(7, 3):
        x = x.to(memory_format=torch.channels_last)  # the Cortex-M targets' user layout
        ours = interp.run((x,))
        edge = run_program(result.host_program, (x,))
        assert len(ours) == len(edge) == 1
        assert ours[0].dtype == edge[0].dtype and torch.equal(ours[0], edge[0])


def _copy(d: Path, tmp_path: Path, name: str) -> Path:
    target = tmp_path / name
    shutil.copytree(d, target)
    return target


def _tamper(kind: str, data: bytes, foreign: bytes) -> bytes:
    if kind == "empty":
        return b""
    if kind == "truncated":
        return data[: len(data) // 2]
    if kind == "flipped":
        flipped = bytearray(data)
        for i in range(len(data) // 2, len(data) // 2 + 16):
            flipped[i] ^= 0xFF
        return bytes(flipped)
    return foreign


@pytest.mark.parametrize("kind", ["empty", "truncated", "flipped", "foreign"])
def test_verify_and_codegen_refuse_a_pte_that_is_not_the_compiled_one(
    compiled: Compiled, tmp_path: Path, kind: str
) -> None:
    d = _copy(compiled["cortex-m33"][1], tmp_path, "out")
    foreign = (compiled["plain"][1] / output.PTE).read_bytes()
    bad = _tamper(kind, (d / output.PTE).read_bytes(), foreign)
    (d / output.PTE).write_bytes(bad)
    with pytest.raises(EtforgeError) as err:
        verify(d, samples=2)
    assert str(d / output.PTE) in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(EtforgeError) as err:
        generate(d / output.PTE, tmp_path / "gen")
    assert str(d / output.PTE) in str(err.value)
    assert not (tmp_path / "gen").exists()


def test_verify_cli_names_a_tampered_pte_in_one_line(compiled: Compiled, tmp_path: Path) -> None:
    d = _copy(compiled["cortex-m33"][1], tmp_path, "out")
    data = bytearray((d / output.PTE).read_bytes())
    data[-40:-24] = bytes(b ^ 0x5A for b in data[-40:-24])
    (d / output.PTE).write_bytes(bytes(data))
    proc = run_cli("verify", str(d), "--samples", "2")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "model.pte is not the program its report.json describes" in proc.stderr


def _writer_and_reader(program: Any) -> tuple[int, int, int]:
    """(a, b, reader): planned values a and b of one memory id where b is written while a is
    still to be read, and the first instruction reading a after b was written — from the
    serialized instructions themselves (an out variant's result is its last argument)."""
    from executorch.exir import schema

    plan = program.execution_plan[0]
    instrs = [i.instr_args for i in plan.chains[0].instructions]
    calls = [
        (k, list(a.args))
        for k, a in enumerate(instrs)
        if isinstance(a, (schema.KernelCall, schema.DelegateCall))
    ]
    written = {args[-1]: k for k, args in reversed(calls)}
    for a, wa in sorted(written.items(), key=lambda kv: kv[1]):
        for b, wb in sorted(written.items(), key=lambda kv: kv[1]):
            va, vb = plan.values[a].val, plan.values[b].val
            if not wa < wb or va.allocation_info is None or vb.allocation_info is None:
                continue
            later = [k for k, args in calls if k > wb and a in args[:-1]]
            if later and va.allocation_info.memory_id == vb.allocation_info.memory_id:
                return a, b, later[0]
    raise AssertionError("the model has no tensor alive across another's write")


def test_an_overlapping_memory_plan_is_caught_at_the_instruction_that_reads_the_clobbered_value(
    compiled: Compiled, tmp_path: Path
) -> None:
    from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

    d = _copy(compiled["cortex-m33"][1], tmp_path, "out")
    clean = verify(d, samples=2)
    assert clean.ok and clean.pte is not None and clean.pte.agreed == clean.pte.samples == 2
    pte = deserialize_pte_binary((d / output.PTE).read_bytes())
    a, b, reader = _writer_and_reader(pte.program)
    values = pte.program.execution_plan[0].values
    alloc = values[a].val.allocation_info
    alloc.memory_offset_low = values[b].val.allocation_info.memory_offset_low  # a now lies on b
    alloc.memory_offset_high = values[b].val.allocation_info.memory_offset_high
    data = bytes(serialize_pte_binary(pte))
    (d / output.PTE).write_bytes(data)
    report = json.loads((d / output.REPORT).read_text())
    report["pte_sha256"] = hashlib.sha256(data).hexdigest()  # as a compile with this plan records
    (d / output.REPORT).write_text(json.dumps(report))
    v = verify(d, samples=2)
    assert not v.ok and v.pte is not None and v.pte.agreed == 0
    failure = v.failures[0]
    assert "differs from the Edge program" in failure
    assert f"first at instruction {reader} (" in failure and f"input value {a} " in failure
    assert "memory plan overlaps" in failure


def test_a_changed_weight_is_named_at_the_instruction_reading_it_with_its_edge_node(
    compiled: Compiled,
) -> None:
    from executorch.exir import schema
    from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

    from etforge.runtime.verification.pte_agreement import compare_with_edge

    result, d = compiled["cortex-m33"]
    pte = deserialize_pte_binary((d / output.PTE).read_bytes())
    plan = pte.program.execution_plan[0]
    weights = [
        (i, v.val)
        for i, v in enumerate(plan.values)
        if isinstance(v.val, schema.Tensor) and v.val.data_buffer_idx > 0 and len(v.val.sizes) == 4
    ]
    index, weight = weights[1]  # the second conv's weights
    buffer = pte.program.constant_buffer[weight.data_buffer_idx]
    buffer.storage = bytes(b ^ 0x40 for b in buffer.storage)
    reader = next(
        k for k, ins in enumerate(plan.chains[0].instructions) if index in getattr(ins.instr_args, "args", [])
    )
    interp = PteInterpreter(bytes(serialize_pte_binary(pte)), "patched.pte")
    inputs = [(x.to(memory_format=torch.channels_last),) for (x,) in _data(7, 2)]
    agreement = compare_with_edge(interp, result.host_program, inputs)
    assert not agreement.ok and agreement.first_difference is not None
    assert (
        f"first at instruction {reader} (cortex_m::quantized_conv2d.out, Edge node "
        in agreement.first_difference
    )


def test_a_device_only_delegate_is_refused(compiled: Compiled) -> None:
    from executorch.exir._serialize._program import deserialize_pte_binary, serialize_pte_binary

    pte = deserialize_pte_binary((compiled["imxrt700"][1] / output.PTE).read_bytes())
    pte.program.execution_plan[0].delegates[0].id = "NeutronBackend"
    pte.program.backend_delegate_data[0].data = b"\x00" * 64  # not a LiteRT partition
    interp = PteInterpreter(bytes(serialize_pte_binary(pte)), "neutron.pte")
    with pytest.raises(
        EtforgeError, match=r"neutron.pte: delegate 0 \(NeutronBackend\).*cannot run it on the host"
    ):
        interp.run(_data(7, 1)[0])
