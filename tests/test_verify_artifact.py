"""verify checks every byte of the output: delegate payloads inside model.pte against the
rebuild, stray partition files, and the report.json -> side-file hash chain."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from shared_outputs import compile_once

from support import REPO, run_cli

MODEL = str(REPO / "tests" / "models" / "user_models.py")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    outs = {}
    for target in ("imxrt700", "imxrt700cm"):
        out = tmp_path_factory.mktemp(target)
        proc = compile_once(f"{MODEL}:small", "--target", target, out=out)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        outs[target] = out
    return outs


def _copy(compiled: dict[str, Path], tmp_path: Path, target: str = "imxrt700") -> Path:
    out = tmp_path / "out"
    shutil.copytree(compiled[target], out)
    return out


def _verify(out: Path):  # type: ignore[no-untyped-def]
    from etforge.runtime.verification.verify import verify

    return verify(out, samples=2)


def _verify_rebuilt(out: Path):  # type: ignore[no-untyped-def]
    from etforge.runtime.verification.verify import verify

    return verify(out, samples=2, lower_again=True)


def test_report_records_each_side_file_and_a_clean_output_verifies(compiled: dict[str, Path]) -> None:
    out = compiled["imxrt700"]
    files = json.loads((out / "report.json").read_text())["files_sha256"]
    assert set(files) == {"float.pt2", "quantized.pt2", "lowered_edge.exir", "partitions/etforge_0.tflite"}
    for name, digest in files.items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest
    v = _verify(out)
    assert v.ok, v.failures


def test_a_flipped_weight_bit_in_the_npu_payload_fails(compiled: dict[str, Path], tmp_path: Path) -> None:
    """The low bit of one weight inside model.pte's NPU payload, report.json's hash updated."""
    from ai_edge_litert import schema_py_generated as schema

    out = _copy(compiled, tmp_path)
    tflite = (out / "partitions" / "etforge_0.tflite").read_bytes()
    model = schema.ModelT.InitFromObj(schema.Model.GetRootAs(tflite, 0))
    weights = max((bytes(b.data) for b in model.buffers if b.data is not None), key=len)
    pte = bytearray((out / "model.pte").read_bytes())
    at = pte.find(tflite) + tflite.find(weights)
    assert pte.count(tflite) == 1 and tflite.count(weights) == 1
    pte[at] ^= 1
    (out / "model.pte").write_bytes(bytes(pte))
    report = json.loads((out / "report.json").read_text())
    report["pte_sha256"] = hashlib.sha256(bytes(pte)).hexdigest()
    (out / "report.json").write_text(json.dumps(report))
    v = _verify(out)
    assert not v.ok
    failure = v.failures[0]
    assert "delegate payload 0 (partition etforge_0) differs from the saved partition at byte" in failure
    again = _verify_rebuilt(out)  # lowered again from quantized.pt2: the same gate
    assert (
        "delegate payload 0 (partition etforge_0) differs from the rebuilt partition at byte"
        in again.failures[0]
    )


def test_a_stray_partition_file_fails(compiled: dict[str, Path], tmp_path: Path) -> None:
    out = _copy(compiled, tmp_path)
    shutil.copy(out / "partitions" / "etforge_0.tflite", out / "partitions" / "etforge_9.tflite")
    v = _verify(out)
    assert not v.ok
    assert [f for f in v.failures if "etforge_9.tflite: not a partition of the program" in f], v.failures


def test_a_program_and_report_from_another_output_are_named(
    compiled: dict[str, Path], tmp_path: Path
) -> None:
    """model.pte + report.json of the imxrt700cm compile beside imxrt700's side files: one
    line naming the first side file that is not the one the report records."""
    out = _copy(compiled, tmp_path)
    for name in ("model.pte", "report.json"):
        shutil.copy(compiled["imxrt700cm"] / name, out / name)
    proc = run_cli("verify", str(out), "--samples", "2")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "float.pt2 is not the file its report.json records" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_float_program_from_another_output_is_named(compiled: dict[str, Path], tmp_path: Path) -> None:
    from etforge.core.common.errors import EtforgeError

    out = _copy(compiled, tmp_path)
    shutil.copy(compiled["imxrt700cm"] / "float.pt2", out / "float.pt2")
    with pytest.raises(EtforgeError, match=r"float\.pt2 is not the file its report\.json records"):
        _verify(out)
