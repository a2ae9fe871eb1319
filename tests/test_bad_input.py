"""Unsupported input is refused with a reason; conversion failures name the node and op."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from etforge.core.build import pipeline
from etforge.core.common.errors import ConversionError
from etforge.core.contracts.converter import SUPPORTED, OpConverter
from etforge.core.litert.convert import convert_program
from etforge.core.registry.manager import registry

from support import REPO, run_cli


def _decisions(
    module: torch.nn.Module, x: tuple[torch.Tensor, ...], target: str, quantize: bool = True
) -> dict[str, str]:
    reg = registry()
    tgt = reg.target(target)
    ep = pipeline.export(module.eval(), x)
    if quantize:
        ep = pipeline.quantize(ep, tgt, [x], reg)
    _, partitioner, _, _ = pipeline.lower(ep, tgt, None, reg)
    return {d.op: d.reason for d in partitioner.decisions if not d.npu}


def test_float_model_refused_on_int8_npu_with_reason() -> None:
    refused = _decisions(torch.nn.Conv2d(3, 4, 3), (torch.randn(1, 3, 5, 5),), "imxrt700", quantize=False)
    assert "float32: the neutron-c NPU runs int8 only" in refused["aten.convolution.default"]


def test_unsupported_shape_is_refused() -> None:
    refused = _decisions(torch.nn.Conv3d(2, 2, 1), (torch.randn(1, 2, 3, 3, 3),), "litert", quantize=False)
    assert "3-D" in refused["aten.convolution.default"]  # the constraint's text, then the culprit


def test_unsupported_attribute_is_refused() -> None:
    pool = torch.nn.AvgPool2d(2, divisor_override=3)
    refused = _decisions(pool, (torch.randn(1, 2, 4, 4),), "litert", quantize=False)
    assert refused["aten.avg_pool2d.default"].endswith(": divisor_override")


def test_neutron_limit_is_refused_with_numbers() -> None:
    big = torch.nn.Conv2d(4096, 4, 5, bias=False)  # 5*5*ceil(4096, 16) = 102400 > 65535
    refused = _decisions(big, (torch.randn(1, 4096, 5, 5),), "imxrt700")
    assert "102400 > 65535" in refused["aten.convolution.default"]


def test_unsupported_dtype_is_refused() -> None:
    class IntAdd(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x.to(torch.int32) + 1).to(torch.float32)

    refused = _decisions(IntAdd(), (torch.randn(1, 4),), "litert", quantize=False)
    assert refused["aten.add.Tensor"] == "int32: the litert NPU runs int8, float32 only"


def test_conversion_failure_names_node_and_op() -> None:
    class Broken(OpConverter):
        ops = ("aten.relu.default",)

        def check(self, node, target):  # noqa: ANN001, ANN201
            return SUPPORTED

        def convert(self, node, ctx):  # noqa: ANN001, ANN201
            raise RuntimeError("cannot handle this layout")

    reg = registry()
    target = reg.target("litert")
    ep = pipeline.export(torch.nn.ReLU(), (torch.randn(1, 3),))
    from executorch.exir import to_edge

    edge_ep = to_edge(ep).exported_program()
    with pytest.raises(
        ConversionError, match=r"node aten_relu_default \(aten.relu.default\): Broken failed: RuntimeError"
    ):
        convert_program(edge_ep, target, {"aten.relu.default": [Broken()]})
    with pytest.raises(
        ConversionError, match=r"aten_relu_default \(aten.relu.default\): no converter plugin handles"
    ):
        convert_program(edge_ep, target, {})


# --- issue 25: usage errors name the option, manifests the key, full disks the path ----------

USER_MODEL = f"{REPO / 'tests' / 'models' / 'user_models.py'}:small"


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("compile", "zoo:cifarnet", "--option", "min_partition_ops=-5"), "min_partition_ops"),
        (("compile", "zoo:cifarnet", "--option", "npu_timeout=-1"), "npu_timeout"),
        (("compile", "zoo:cifarnet", "--option", "operators_not_to_delegate=no.such.op"), "no.such.op"),
        (("verify", "OUT", "--samples", "0"), "--samples"),
        (("verify", "OUT", "--max-accuracy-drop", "nan"), "--max-accuracy-drop"),
        (("cache", "prune", "--max-size", "inf"), "--max-size"),
        (("cache", "prune", "--max-size", "nan"), "--max-size"),
        (("cache", "prune", "--max-size", "-1"), "--max-size"),
        (("cache", "prune", "--max-size", "abc"), "--max-size"),
    ],
)
def test_bad_values_are_usage_errors_naming_the_option(
    tmp_path: Path, args: tuple[str, ...], named: str
) -> None:
    argv = [str(tmp_path / "o") if a == "OUT" else a for a in args]
    if argv[0] == "compile":
        argv += ["-o", str(tmp_path / "o")]
    proc = run_cli(*argv, env={"ETFORGE_CACHE_DIR": str(tmp_path / "cache")})
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and named in errors[0], proc.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("line", "key"), [("calib = 5", "'calib'"), ('float = "false"', "'float'")])
def test_manifest_values_of_the_wrong_type_name_the_key(tmp_path: Path, line: str, key: str) -> None:
    from etforge.core.batch.run import load_manifest
    from etforge.core.common.errors import EtforgeError

    manifest = tmp_path / "m.toml"
    manifest.write_text(f'models = ["zoo:cifarnet"]\ntargets = ["imxrt700cm"]\n{line}\n')
    with pytest.raises(EtforgeError) as err:
        load_manifest(manifest, tmp_path / "out")
    assert str(err.value).startswith(f"manifest {manifest}: {key} must be")


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_forged_new_output_never_replaces_a_good_one(tmp_path: Path) -> None:
    """``OUT.new-<dead pid>-*`` is what a swap cut short leaves, but only beside its
    ``OUT.old-`` with OUT gone; a directory merely named so is removed, OUT stays."""
    from etforge.core.build import output

    out = tmp_path / "out"
    out.mkdir()
    (out / "model.pte").write_bytes(b"good program")
    (out / "report.json").write_text('{"model": "good"}')
    forged = tmp_path / f"out.new-{_dead_pid()}-forged"
    forged.mkdir()
    (forged / "model.pte").write_bytes(b"evil program")
    (forged / "report.json").write_text('{"model": "evil"}')
    output.recover(out)
    assert (out / "model.pte").read_bytes() == b"good program"
    assert not forged.exists()


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs: a real ENOSPC (the test needs root or CAP_SYS_ADMIN to mount it)."""
    mnt = tmp_path / "full"
    mnt.mkdir()
    if subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True
    ).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_disk_full_while_writing_the_output_is_one_line_naming_it(full_disk: Path) -> None:
    out = full_disk / "out"
    proc = run_cli("compile", USER_MODEL, "-o", str(out), env={"ETFORGE_NO_CACHE": "1"})
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert proc.returncode == 1 and len(errors) == 1, proc.stderr
    assert str(out) in errors[0] and "No space left on device" in errors[0] and "unexpected" not in errors[0]
    assert list(full_disk.iterdir()) == []  # nothing half-written


def test_program_writer_on_a_full_disk_names_the_file(full_disk: Path) -> None:
    from etforge.core.common.errors import EtforgeError
    from etforge.core.serialize.program_writer import ProgramWriter

    big = torch.export.export(torch.nn.Linear(256, 256), (torch.randn(1, 256),))  # 256 KiB of weights
    writer = ProgramWriter(full_disk, ("float.pt2", "quantized.pt2"))
    writer.start(big, None)
    with pytest.raises(EtforgeError) as err:
        writer.finish()
    assert str(err.value).startswith(f"could not write float.pt2 into {full_disk}: No space left on device")
    assert "\n" not in str(err.value)


def test_a_full_cache_is_one_warning_line(full_disk: Path, tmp_path: Path) -> None:
    from etforge.core.cache.store import BuildCache, CacheError

    src = tmp_path / "src"
    src.mkdir()
    (src / "model.pte").write_bytes(os.urandom(200_000))
    with pytest.raises(CacheError) as err:
        BuildCache(full_disk / "cache").store("ab" * 32, src)
    message = str(err.value)
    assert "\n" not in message and len(message) < 300 and "No space left on device" in message
    assert message.startswith(f"build cache {full_disk / 'cache'}")
    assert not any((full_disk / "cache").rglob("model.pte"))  # nothing half-stored


def test_non_utf8_paths_work_in_every_command(tmp_path: Path) -> None:
    out = tmp_path / os.fsdecode(b"out\xff")
    cache_dir = tmp_path / os.fsdecode(b"cache\xfe")
    env = {"ETFORGE_NO_CACHE": "0", "ETFORGE_CACHE_DIR": str(cache_dir)}

    def ok(*args: str) -> str:
        proc = subprocess.run(  # output that names the paths is not UTF-8 either
            [sys.executable, "-m", "etforge", *args],
            capture_output=True,
            text=True,
            errors="surrogateescape",
            env={**os.environ, **env, "COLUMNS": "200"},
            timeout=600,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    ok("compile", USER_MODEL, "-o", str(out), "--cache", "direct")  # a factory: direct mode opted in
    assert json.loads((out / "report.json").read_text())["cache"]["mode"] == "miss"
    ok("compile", USER_MODEL, "-o", str(out), "--cache", "direct")
    assert json.loads((out / "report.json").read_text())["cache"]["mode"] == "direct"
    ok("report", str(out))
    ok("codegen", str(out / "model.pte"), "-o", str(out / "gen"))
    assert any((out / "gen").iterdir())
    ok("verify", str(out))
    assert "1 builds" in ok("cache", "info")
    assert "removed 1 builds" in ok("cache", "clear")
