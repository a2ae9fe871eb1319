"""Each NPU delegate of a multi-partition program gets its own partition's working memory.

An LSTM decomposes per time step into NPU partitions of different working memories, and
ExecuTorch emits their delegates in program order (``etforge_0, etforge_7, etforge_6, ...``)
while report.json lists the partitions in tag order. A reader that pairs the two lists by
position sizes one partition's NPU working memory with another's figure. Here every delegate
of the ``.pte`` (read with ExecuTorch's own deserializer, named by the compile spec it kept)
is held to the figure planned from that very partition: its host-only payload, or, for a
device payload (the SDK double of tests/sdk_double), the LiteRT model the compile wrote for it.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from etforge.codegen import generate
from etforge.codegen.pte import read_program
from etforge.core.common.errors import EtforgeError
from etforge.core.litert import payload
from etforge.core.serialize.npu_memory import plan_partition
from etforge.runtime.verification.report_fields import mismatches

from support import REPO, run_cli

MODEL = f"{REPO / 'tests' / 'models' / 'recurrent_models.py'}:lstm_spotter"
DOUBLE = REPO / "tests" / "sdk_double"
KINDS = ("host-only", "device")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """OUT of the LSTM compiled for imxrt700 without the SDK and with the SDK double."""
    outs = {}
    for kind in KINDS:
        out = tmp_path_factory.mktemp(kind) / "out"
        sdk = {"pythonpath": DOUBLE, "env": {"ETFORGE_SDK_DOUBLE": "v1"}} if kind == "device" else {}
        proc = run_cli("compile", MODEL, "--target", "imxrt700", "-o", str(out), **sdk)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        outs[kind] = out
    return outs


def _delegates(out: Path, kind: str) -> list[tuple[str, int]]:
    """(partition, working bytes planned from that partition) of each delegate, in program order."""
    from executorch.exir._serialize._program import deserialize_pte_binary

    program = deserialize_pte_binary((out / "model.pte").read_bytes()).program
    found = []
    for d in program.execution_plan[0].delegates:
        name = {s.key: bytes(s.value).decode() for s in d.compile_specs}["partition"]
        data = bytes(program.backend_delegate_data[d.processed.index].data)
        assert (data[:4] == payload.MAGIC) == (kind == "host-only"), f"{kind}: {name}"
        if data[:4] == payload.MAGIC:
            blob = payload.unpack(data)
            assert blob.partition == name and blob.host_only
            model = blob.data
        else:
            model = (out / "partitions" / f"{name}.tflite").read_bytes()
        found.append((name, plan_partition(name, model).working_bytes))
    return found


@pytest.mark.parametrize("kind", KINDS)
def test_each_delegate_gets_its_own_partitions_working_memory(compiled: dict[str, Path], kind: str) -> None:
    out = compiled[kind]
    delegates = _delegates(out, kind)
    report = json.loads((out / "report.json").read_text())
    listed = [(p["name"], p["working_bytes"]) for p in report["memory"]["npu_partitions"]]
    # The premise: the two orders differ, and so do the figures where they do.
    assert sorted(delegates) == sorted(listed)
    assert [w for _, w in delegates] != [w for _, w in listed], "no index mix-up would show"
    header = next((out / "codegen").glob("*.h")).read_text()
    row = re.search(r"kNpuWorkingBytes\[(\d+)\] = \{ ([^}]*) \};\s*// (.*)", header)
    assert row is not None, header
    assert int(row[1]) == len(delegates)
    assert [int(v) for v in row[2].split(", ")] == [w for _, w in delegates]
    assert row[3].split(", ") == [n for n, _ in delegates]
    assert re.findall(r"^//   (\w+): ", header, re.M) == [n for n, _ in delegates]  # where each runs
    # verify's report-fields gate accepts the report as written
    assert mismatches(read_program(out / "model.pte").program, out / "model.pte", report) == []


def _forge(out: Path, dest: Path, edit: Any) -> Path:
    shutil.copytree(out, dest)
    report = json.loads((dest / "report.json").read_text())
    edit(report["memory"]["npu_partitions"])
    (dest / "report.json").write_text(json.dumps(report))
    return dest


def test_a_report_entry_without_its_delegate_is_named(compiled: dict[str, Path], tmp_path: Path) -> None:
    """verify names the delegate whose partition the report lacks; codegen refuses to size a
    device payload without its own partition's figure, in one line."""
    first = _delegates(compiled["device"], "device")[0][0]

    def rename(parts: list[dict[str, Any]]) -> None:
        next(p for p in parts if p["name"] == first)["name"] = "etforge_99"

    forged = _forge(compiled["device"], tmp_path / "out", rename)
    found = mismatches(
        read_program(forged / "model.pte").program,
        forged / "model.pte",
        json.loads((forged / "report.json").read_text()),
    )
    assert found == [
        f"report.json memory.npu_partitions (delegate 0's partition) is None, the program (model.pte) has {first!r}"
    ]
    with pytest.raises(EtforgeError) as err:
        generate(forged / "model.pte", tmp_path / "gen")
    message = str(err.value)
    assert f"no entry for delegate 0 (partition {first!r})" in message and "\n" not in message, message


def test_a_profiles_delegate_calls_are_named_by_the_delegate_they_call(compiled: dict[str, Path]) -> None:
    """``run --profile`` names each delegate call's partition from the program: the calls run in
    program order, not in report.json's tag order. The QEMU trace is stood in for by one event
    per instruction (what ``_per_op`` matches against the plan); the program is the compile's."""
    from types import SimpleNamespace

    from etforge.runtime.execution.pte_interpreter import PteInterpreter
    from etforge.runtime.firmware.device import _EVENT_OF, _per_op
    from etforge.runtime.firmware.device_profile import per_node

    out = compiled["host-only"]
    interp = PteInterpreter((out / "model.pte").read_bytes(), str(out / "model.pte"))
    kinds = [type(i.instr_args).__name__ for i in interp.plan.chains[0].instructions]
    trace = SimpleNamespace(events=[(_EVENT_OF[k], 1) for k in kinds], instructions_per_tick=1)
    per_op, note = _per_op(interp, trace)
    assert per_op, note
    report = json.loads((out / "report.json").read_text())
    called = [p["partition"] for p in per_node(report, per_op)["partitions"]]
    assert called == [n for n, _ in _delegates(out, "host-only")]
    assert called != [p["name"] for p in report["partitions"]], "the orders differ: the premise"
