"""imxrt700cm programs with host-only NPU partitions run whole on the emulated Cortex-M33: the
CPU side in ExecuTorch's runtime, each partition in TensorFlow Lite Micro with CMSIS-NN — an
explicit opt-in (``--cpu-partitions``), never the NPU — bit for bit what the host interpreter
computes with LiteRT's reference kernels for the partitions."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from etforge.core.common.errors import EtforgeError
from etforge.runtime.firmware import build, conformance, device, sources, tflm

from support import THIRD_PARTY, run_cli


def _missing() -> str | None:
    why = conformance.missing()
    if why is None:
        try:
            tflm.locate_tflm()
        except EtforgeError as e:
            return str(e)
    return why


pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))


@pytest.fixture(scope="module")
def cifarnet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tflm") / "cifarnet"
    proc = run_cli("compile", "zoo:cifarnet", "--target", "imxrt700cm", "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def test_one_cmsis_nn_serves_both() -> None:
    """ExecuTorch's CMSIS-NN pin and TFLM's have the same sources byte for byte: the image links
    ExecuTorch's for the cortex_m ops and TFLM's kernels alike, and no result can change."""
    tp = THIRD_PARTY
    if not (tp / "tflm-deps" / "cmsis-nn-tflm").is_dir():
        pytest.skip("TFLM's CMSIS-NN pin is not in ../shared/third_party")
    assert tflm.identical_cmsis_nn(sources.locate().cmsis_nn, tp / "tflm-deps" / "cmsis-nn-tflm")


def test_partitions_need_the_opt_in(cifarnet: Path) -> None:
    with pytest.raises(
        EtforgeError, match=r"--cpu-partitions runs host-only partitions in TensorFlow Lite Micro"
    ):
        device.verify(cifarnet, samples=1)


def test_imxrt700cm_program_with_partitions_in_tflm_is_bit_exact(cifarnet: Path) -> None:
    v = device.verify(cifarnet, samples=3, cpu_partitions=True)
    assert v.failures == [] and v.identical == 3, v.failures
    _arenas_are_the_compile_time_figures(cifarnet, v.tflm_arenas)
    delegates = [r for r in v.per_op if r["op"].startswith("delegate")]
    assert delegates and all(r["instructions"] > 0 for r in delegates)


def test_verify_cli_says_where_partitions_ran(cifarnet: Path) -> None:
    proc = run_cli("verify", str(cifarnet), "--runtime", "qemu-m33", "--samples", "1", "--cpu-partitions")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "in TensorFlow Lite Micro with CMSIS-NN (--cpu-partitions), not on the NPU" in proc.stdout
    assert "CPU side" in proc.stdout


def test_imxrt700_program_with_partitions_in_tflm_is_bit_exact(tmp_path: Path) -> None:
    """The other NPU target: ds_cnn (depthwise-separable convs) for imxrt700, through the CLI."""
    out = tmp_path / "ds_cnn"
    proc = run_cli("compile", "zoo:ds_cnn", "--target", "imxrt700", "-o", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = run_cli("verify", str(out), "--runtime", "qemu-m33", "--samples", "2", "--cpu-partitions")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2/2 samples" in proc.stdout and "verify passed on qemu-m33" in proc.stdout


def test_conv_flip_conv_for_imxrt700cm_is_bit_exact_in_tflm(tmp_path: Path) -> None:
    """Two partitions with the portable flip between them (../shared/tflm-spike/mix.py): was
    2/3, sample 2's output 2 one step off (TFLM's FULLY_CONNECTED rounds twice, LiteRT's once);
    the host now computes TFLM's FC (``runtime.arithmetic.tflm_arith``)."""
    import torch
    from test_device_conformance import _ConvFlipConv

    import etforge

    torch.manual_seed(0)
    model = _ConvFlipConv().eval()
    calibration = [(torch.randn(1, 3, 16, 16),) for _ in range(16)]
    compiled = etforge.compile(model, calibration[0], target="imxrt700cm", calibration=calibration)
    assert [p["operators"].get("FULLY_CONNECTED") for p in compiled.report["partitions"]] == [None, 1]
    out = compiled.save(tmp_path / "flip")
    compiled.codegen(out / "codegen")
    v = device.verify(out, samples=3, cpu_partitions=True)
    assert v.failures == [] and v.identical == 3, v.failures
    _arenas_are_the_compile_time_figures(out, v.tflm_arenas)


def _arenas_are_the_compile_time_figures(out: Path, arenas: list[tuple[int, int]]) -> None:
    """The image reserves, per partition, the TFLM arena report.json states (computed at
    compile time), and TFLM used no more than that; far below the 1 MiB it reserved before."""
    import json

    parts = json.loads((out / "report.json").read_text())["memory"]["npu_partitions"]
    assert [size for size, _ in arenas] == [p["fallback_arena_bytes"] for p in parts]
    assert all(0 < used <= size < (1 << 20) for size, used in arenas), arenas


def _forced_image(out: Path, partitions: list[tuple[str, bytes]]) -> build.Image:
    """``out``'s image with its partitions in TFLM, built now (an earlier run's is removed)."""
    img = build.build_image(out, partitions=partitions, arena_shrink=16)
    if "image" not in img.built:
        with build._locked(build.cache_root() / "images" / f"{img.key}.lock"):
            shutil.rmtree(img.elf.parent)
        img = build.build_image(out, partitions=partitions, arena_shrink=16)
    assert "image" in img.built
    return img


def test_the_delegate_compiles_once_for_every_program(cifarnet: Path, tmp_path: Path) -> None:
    """The TFLM delegate's compile line is the same for every program: the program's resolver
    and arenas are its generated ``etforge_tflm_ops.cpp``, compiled with the kernels. An image
    of the program in another directory (another generated include directory than the library
    tree's last image had) reuses the delegate object the tree holds (issue 47: it was compiled
    again for every image, ~4 CPU s of TFLM's headers each)."""
    _, interp = device._load(cifarnet)
    parts = device.host_only_partitions(cifarnet, interp)
    where = build.cache_root() / f"libs-{build.library_key(sources.locate())}" / "build" / "CMakeFiles"

    def delegate() -> list[tuple[int, int]]:
        return [(o.stat().st_ino, o.stat().st_mtime_ns) for o in where.glob("et_tflm_delegate.dir/**/*.obj")]

    if not delegate():  # no TFLM image built in this tree yet
        _forced_image(shutil.copytree(cifarnet, tmp_path / "first"), parts)
    before = delegate()
    _forced_image(shutil.copytree(cifarnet, tmp_path / "moved"), parts)
    assert before and delegate() == before, "the program's image compiled the delegate again"


def test_every_interpreter_source_links(cifarnet: Path) -> None:
    """``tflm.CORE`` is what an image links: the linker takes every one of its objects from the
    interpreter's archive into cifarnet's image (runner.map), so no source is compiled for
    nothing (issue 47: 8 of 37 were)."""
    _, interp = device._load(cifarnet)
    img = build.build_image(cifarnet, partitions=device.host_only_partitions(cifarnet, interp))
    text = (img.elf.parent / "runner.map").read_text()
    members = text.split("Archive member included", 1)[1].split("Discarded input sections", 1)[0]
    linked = set(re.findall(r"libet_tflm\.a\(([^)]+)\.obj\)", members))
    assert {Path(f).name for f in tflm.CORE} - linked == set()


def test_only_sources_that_include_the_schema_load_the_pch(tmp_path: Path) -> None:
    """A TFLM source that never includes ``schema_generated.h`` compiles without the precompiled
    header, whose ~1.3 CPU s load is more than such a source costs alone (issue 47; the object is
    the same byte for byte): the compiler's own dependency list (``-M``) of each source taken out
    of the PCH names no schema header, and one kept in it (the interpreter) does."""
    import subprocess

    from etforge.codegen.cmake_runtime import CPU_FLAGS

    lists = tflm.cmake_lists(tflm.locate_tflm(), sources.locate().cmsis_nn, sorted(tflm.KERNELS), tmp_path)
    cmd = [
        "arm-none-eabi-g++", "-std=c++17", *CPU_FLAGS["cortex-m33"].split(), "-M",
        *(f"-D{d}" for d in lists["TFLM_DEFINITIONS"]), *(f"-I{d}" for d in lists["TFLM_INCLUDE_DIRS"]),
    ]  # fmt: skip

    def includes_schema(source: str) -> bool:
        deps = subprocess.run([*cmd, source], capture_output=True, text=True, check=True).stdout
        return tflm.PCH_HEADER in deps

    plain = lists["TFLM_NO_PCH_SOURCES"]
    core = set(lists["TFLM_CORE_SOURCES"])
    assert plain and set(plain) & core and set(plain) - core  # the interpreter's and a kernel's
    assert [s for s in plain if includes_schema(s)] == []
    interpreter = next(s for s in core if s.endswith("/micro_interpreter.cc"))
    assert interpreter not in plain and includes_schema(interpreter)


def test_missing_tflm_tree_is_told_before_building_anything(
    cifarnet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without TFLM's sources an image with partitions is refused at once, naming the variable,
    not after the minutes a cold library build takes (a fresh cache stays empty)."""
    monkeypatch.delenv(tflm.ENV_TFLM, raising=False)
    _, interp = device._load(cifarnet)
    parts = device.host_only_partitions(cifarnet, interp)
    root = tmp_path / "cache"
    with pytest.raises(EtforgeError, match=r"needs TensorFlow Lite Micro's sources: set \$ETFORGE_TFLM_SRC"):
        build.build_image(cifarnet, partitions=parts, root=root)
    assert not root.exists() or not any(root.iterdir())
