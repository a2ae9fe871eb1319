"""`etforge compile` and `etforge verify` end to end, and their errors on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from shared_outputs import compile_once

from support import REPO, run_cli, write_distribution

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


def test_compile_writes_program_partitions_and_report(compiled: dict[str, Path]) -> None:
    from executorch.codegen.tools.selective_build import _get_program_from_buffer, _get_program_operators

    for target, out in compiled.items():
        report = json.loads((out / "report.json").read_text())
        assert report["target"] == target and report["quantized"]
        assert report["macs"]["npu_share"] == 1.0 and len(report["partitions"]) == 1
        assert all(n["placement"] == "npu" and n["plugin"] for n in report["nodes"])
        tflite = (out / report["partitions"][0]["tflite"]).read_bytes()
        assert tflite[4:8] == b"TFL3"
        assert report["host_only"] and "not installed" in report["npu_compiler"]["status"]
        pte = (out / "model.pte").read_bytes()
        ops = _get_program_operators(_get_program_from_buffer(pte))
        # only the boundary (de)quantization runs on the CPU
        assert ops and all("quantize" in op for op in ops), ops
        if target == "imxrt700cm":
            assert all(op.startswith("cortex_m::") for op in ops), ops


def test_verify_passes_on_compiled_output(compiled: dict[str, Path]) -> None:
    proc = run_cli("verify", str(compiled["imxrt700"]))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "top-1 vs quantized ref in float64" in proc.stdout and "verify passed" in proc.stdout


def test_verify_fails_when_outputs_were_tampered_with(compiled: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(compiled["imxrt700cm"], out)
    tflite = next((out / "partitions").glob("*.tflite"))
    tflite.write_bytes(tflite.read_bytes()[:-1] + b"\x01")
    proc = run_cli("verify", str(out))
    # caught first by report.json's hash chain, naming the file
    assert proc.returncode == 1 and "etforge_0.tflite is not the file its report.json records" in proc.stderr


def test_compile_is_deterministic(compiled: dict[str, Path], tmp_path: Path) -> None:
    proc = run_cli("compile", f"{MODEL}:small", "--target", "imxrt700cm", "-o", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    first = compiled["imxrt700cm"]
    assert (tmp_path / "model.pte").read_bytes() == (first / "model.pte").read_bytes()
    for p in (first / "partitions").glob("*.tflite"):
        assert (tmp_path / "partitions" / p.name).read_bytes() == p.read_bytes()


def _fails(tmp_path: Path, *args: str, pythonpath: Path | None = None, code: int = 1) -> str:
    """A failed compile leaves the previous output as it was and writes nothing of its own."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    (out / "model.pte").write_bytes(b"program from an earlier run")
    (out / "report.json").write_text('{"model": "earlier"}')
    proc = run_cli(*args, "-o", str(out), pythonpath=pythonpath)
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["model.pte", "report.json"]
    assert (out / "model.pte").read_bytes() == b"program from an earlier run"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("out.")] == [], "staging left behind"
    return proc.stderr


def test_missing_model_file(tmp_path: Path) -> None:
    assert "does-not-exist.py does not exist" in _fails(tmp_path, "compile", "does-not-exist.py:build")


def test_missing_factory_lists_callables(tmp_path: Path) -> None:
    err = _fails(tmp_path, "compile", f"{MODEL}:nope")
    assert "no callable 'nope'" in err and "small" in err


def test_factory_returning_wrong_thing(tmp_path: Path) -> None:
    err = _fails(tmp_path, "compile", f"{MODEL}:not_a_tuple")
    assert "not_a_tuple returned Small" in err and "expected (torch.nn.Module" in err


def test_factory_raising(tmp_path: Path) -> None:
    assert "raises() raised RuntimeError: weights file missing" in _fails(
        tmp_path, "compile", f"{MODEL}:raises"
    )


def test_export_rejection_is_shown_without_traceback(tmp_path: Path) -> None:
    err = _fails(tmp_path, "compile", f"{MODEL}:unexportable")
    assert "torch.export rejected" in err and f"{MODEL}:unexportable" in err


def test_calibration_of_wrong_shape(tmp_path: Path) -> None:
    calib = tmp_path / "calib.pt"
    torch.save([(torch.randn(1, 3, 9, 9),)], calib)
    err = _fails(tmp_path, "compile", f"{MODEL}:small", "--calib", str(calib))
    assert (
        "calibration batch 0, input 0 is torch.float32[1, 3, 9, 9]; expected torch.float32[1, 3, 8, 8]" in err
    )


def test_calibration_of_wrong_dtype(tmp_path: Path) -> None:
    calib = tmp_path / "calib.pt"
    torch.save([(torch.zeros(1, 3, 8, 8, dtype=torch.int32),)], calib)
    assert "torch.int32[1, 3, 8, 8]" in _fails(tmp_path, "compile", f"{MODEL}:small", "--calib", str(calib))


def test_unknown_target_lists_known(tmp_path: Path) -> None:
    err = _fails(tmp_path, "compile", f"{MODEL}:small", "--target", "imxrt1170", code=2)  # a usage error
    assert "unknown target 'imxrt1170'" in err and "imxrt700cm" in err


def test_unknown_option(tmp_path: Path) -> None:
    err = _fails(tmp_path, "compile", f"{MODEL}:small", "--target", "imxrt700", "--option", "turbo=1", code=2)
    assert "unknown option 'turbo' for target 'imxrt700'" in err and "min_partition_ops" in err


CRASHY = """
import os
from etforge import hookimpl
from etforge.core.common.isolated import run_isolated
from etforge.core.contracts.npu_compiler import NpuCompiler, NpuPayload
from etforge.core.contracts.target import NpuSpec, TargetSpec


def crash(data):
    os.abort()


class Crashy(NpuCompiler):
    name = "crashy"

    def available(self):
        return True, "installed"

    def compile(self, tflite, target, options, partition):
        out, _, _ = run_isolated("crashy_npu:crash", tflite, f"crashy compiler on partition {partition}")
        return NpuPayload("crashy", out, host_only=False)


@hookimpl
def etforge_npu_compilers():
    return [Crashy()]


@hookimpl
def etforge_targets():
    return [TargetSpec(name="crashy-npu", description="crashes", npu=NpuSpec(family="litert", dtypes=("int8",), compiler="crashy"))]
"""


def test_npu_compiler_crash_names_the_partition(tmp_path: Path) -> None:
    site = write_distribution(
        tmp_path / "site", "crashy-npu", "0.1", {"crashy": "crashy_npu"}, {"crashy_npu": CRASHY}
    )
    err = _fails(tmp_path, "compile", f"{MODEL}:small", "--target", "crashy-npu", pythonpath=site)
    assert "crashy compiler on partition etforge_0" in err and "crashed (signal 6)" in err


def test_compile_from_pt2_and_float(tmp_path: Path) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("user_models", MODEL)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    module, example, _ = mod.small()
    pt2 = tmp_path / "small.pt2"
    torch.export.save(torch.export.export(module, example), str(pt2))
    out = tmp_path / "out"
    proc = run_cli("compile", str(pt2), "--target", "litert", "--float", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert not report["quantized"] and report["macs"]["npu_share"] == 1.0
    assert run_cli("verify", str(out)).returncode == 0
    # the Neutron NPU runs int8 only: a float compile leaves every node on the CPU, with the reason
    out2 = tmp_path / "out2"
    proc = run_cli("compile", str(pt2), "--target", "imxrt700", "--float", "-o", str(out2))
    assert proc.returncode == 0, proc.stderr
    nodes = json.loads((out2 / "report.json").read_text())["nodes"]
    assert all(n["placement"] == "portable" and "int8 only" in n["reason"] for n in nodes)


def test_not_a_pt2(tmp_path: Path) -> None:
    bad = tmp_path / "junk.pt2"
    bad.write_bytes(b"not a zip")
    assert "not a torch.export program" in _fails(tmp_path, "compile", str(bad))
